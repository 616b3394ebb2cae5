"""`run --here` and the signing key (docs/how-it-works.md, "What an image can and cannot do to the verdict"):
the environment under test runs as the runner's user, beside the runner that holds the key. A
real virtual environment with a hostile `.pth` hook (it runs in every python of the environment:
every stage, the fingerprint) tries every route to the key and to the runner; it finds nothing,
and the attempt verifies with the real key, with the verdict the probes really returned. Where
bubblewrap cannot run (not installed; user namespaces refused, for real), signing is refused
before any work unless the user accepts it, and then the statement says keyIsolation: none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import imagegate

PASSPHRASE = "passphrase-the-probes-must-never-see-7f3a"

# Runs at the start of every python of the hostile environment (a .pth hook). Each route prints
# one line, `thief: ROUTE: OUTCOME`, to stderr (a stage's stderr is evidence) and to a drop
# folder outside the evidence; FOUND means it reached a key, the runner or a way to either.
THIEF = r"""
import json, os, socket, sys
CONF = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_imagegate_thief.json")))
SECRETS = [s.encode() for s in CONF["secrets"]]
LINES = []

def say(route, outcome):
    LINES.append("thief: %s: %s" % (route, outcome))

def attempt(route, read):
    try:
        data = read()
    except Exception as e:
        return say(route, "blocked (%s)" % type(e).__name__)
    hit = any(s in data for s in SECRETS)
    say(route, "FOUND" if hit else "nothing (%d bytes)" % len(data))

def read(path, size=1 << 20):
    with open(path, "rb") as f:
        return f.read(size)

def folder(path):
    return b"".join(read(os.path.join(path, n)) for n in sorted(os.listdir(path)))

def memory(pid):
    for line in read("/proc/%d/maps" % pid).decode().splitlines():
        span, perms = line.split()[:2]
        if perms.startswith("r"):
            with open("/proc/%d/mem" % pid, "rb") as f:
                f.seek(int(span.split("-")[0], 16))
                if f.read(4096):
                    return SECRETS[0]  # the runner's memory can be read: the key is in there
    return b""

def descriptors(pid):
    # Listed at all: the runner's descriptors (its key file while it reads it) can be opened.
    return SECRETS[0] if os.listdir("/proc/%d/fd" % pid) else b""

def engine():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(CONF["engine_socket"])
    s.sendall(b"GET /version HTTP/1.0\r\n\r\n")
    return SECRETS[0] if s.recv(64).startswith(b"HTTP/") else b""

def write_evidence():
    with open(os.path.join(CONF["evidence"], "planted-by-the-thief"), "w") as f:
        f.write("x")
    return SECRETS[0]

for name, path in CONF["keys"].items():
    attempt("read " + name, lambda: read(path))
attempt("read the default key's folder", lambda: folder(CONF["default_folder"]))
attempt("own environment", lambda: repr(sorted(os.environ.items())).encode())
runners, pid = [], os.getppid()
while pid > 0:  # every ancestor: its environment (the runner is one, or was)
    attempt("ancestor %d environ" % pid, lambda: read("/proc/%d/environ" % pid))
    try:
        pid = int(read("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()[1])
    except Exception:
        break
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        attempt("process %s environ" % entry, lambda: read("/proc/%s/environ" % entry))
        try:
            if b"--key" in read("/proc/%s/cmdline" % entry):
                runners.append(int(entry))
        except OSError:
            pass
say("runner process", "FOUND %s" % runners if runners else "not visible")
for pid in runners:
    attempt("runner %d fd" % pid, lambda: descriptors(pid))
    attempt("runner %d mem" % pid, lambda: memory(pid))
attempt("engine socket", engine)
attempt("write the evidence folder", write_evidence)
text = "\n".join(LINES) + "\n"
sys.stderr.write(text)
try:
    with open(os.path.join(CONF["drop"], "%d.txt" % os.getpid()), "w") as f:
        f.write(text)
except OSError:
    pass
"""


def keygen(prefix: Path, env: dict[str, str]) -> Path:
    r = imagegate("keygen", "--out", str(prefix), env=env)
    assert r.returncode == 0, r.stderr
    return prefix.with_name(prefix.name + ".key")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True, timeout=300)
    return env


def plant_thief(venv: Path, conf: dict[str, object]) -> None:
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "_imagegate_thief.py").write_text(THIEF)
    (site / "_imagegate_thief.json").write_text(json.dumps(conf))
    (site / "zz_imagegate_thief.pth").write_text("import _imagegate_thief\n")


def thief_lines(attempt: Path) -> list[str]:
    lines = []
    for f in sorted(attempt.glob("stages/*/stderr.txt")):
        lines += [x for x in f.read_text().splitlines() if x.startswith("thief: ")]
    return lines


def test_a_hostile_environment_finds_no_key_and_cannot_forge_the_verdict(venv: Path, tmp_path: Path) -> None:
    config, drop, out = tmp_path / "config", tmp_path / "drop", tmp_path / "out"
    drop.mkdir()
    out.mkdir()
    with_pass = {"IMAGEGATE_KEY_PASSWORD": PASSPHRASE}
    key = keygen(tmp_path / "named", with_pass)  # --key, passphrase-protected
    env_key = keygen(tmp_path / "by-variable", with_pass)
    default = keygen(config / "imagegate" / "signing", with_pass)
    plant_thief(
        venv,
        {
            "keys": {
                "--key": str(key),
                "IMAGEGATE_SIGNING_KEY": str(env_key),
                "the default key": str(default),
            },
            "default_folder": str(default.parent),
            "secrets": ["PRIVATE KEY", PASSPHRASE, "IMAGEGATE_SIGNING_KEY", "IMAGEGATE_KEY_PASSWORD"],
            "engine_socket": "/var/run/docker.sock",
            "evidence": str(out),
            "drop": str(drop),
        },
    )
    env = {**with_pass, "IMAGEGATE_SIGNING_KEY": str(env_key), "XDG_CONFIG_HOME": str(config)}
    python = str(venv / "bin" / "python")
    r = imagegate("run", "--here", "--python", python, "-p", "python", "-m", "json", "-o", str(out),
                  "--key", str(key), "--format", "json", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = out.glob("*/*/")
    lines = thief_lines(attempt)
    assert lines, "the hook did not run in the stages"
    assert not [x for x in lines if "FOUND" in x], lines
    for route in (
        "read --key",
        "read IMAGEGATE_SIGNING_KEY",
        "read the default key",
        "read the default key's folder",
    ):
        assert any(x.startswith(f"thief: {route}: ") for x in lines), route
    assert "thief: own environment: nothing" in "\n".join(lines)
    assert "thief: runner process: not visible" in lines
    assert any(x.startswith("thief: engine socket: blocked") for x in lines), lines
    assert any(x.startswith("thief: write the evidence folder: blocked") for x in lines), lines
    assert any(x.startswith("thief: ancestor ") for x in lines)  # the controller, as far as it sees
    # Nothing got out either (the fingerprint's interpreter runs the hook too, outside the stages).
    assert not [f for f in drop.iterdir() if "FOUND" in f.read_text()]
    # The attempt is signed by the real key and says what the probes returned.
    statement = r.json()
    pred = statement["predicate"]
    assert {s["id"]: s["status"] for s in pred["stages"]} == {"pip_check": "PASS", "find_spec": "PASS"}
    assert pred["environment"]["keyIsolation"] == "bubblewrap"
    # The probes ran under the seccomp filter, and the statement says which one.
    filtered = pred["environment"]["key_isolation"]["seccomp"]
    assert (
        filtered["seccomp"] is True and "keyctl" in filtered["denied"] and len(filtered["bpf_sha256"]) == 64
    )
    hidden = pred["environment"]["key_isolation"]["hidden"]
    assert {"the signing key", "the key IMAGEGATE_SIGNING_KEY names", "the default key's folder"} <= set(
        hidden
    )
    pub = key.with_suffix(".pub")
    v = imagegate(
        "verify", str(attempt / "attestation.dsse.json"), "--key", str(pub), "--expect-verdict", "PASS"
    )
    assert v.returncode == 0, v.stdout + v.stderr


def _no_bwrap_path(tmp_path: Path) -> str:
    """A PATH with everything of this one but bubblewrap: the lookup finds no bwrap, honestly."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if (
                    name != "bwrap"
                    and not (bin_ / name).exists()
                    and os.access(os.path.join(d, name), os.X_OK)
                ):
                    (bin_ / name).symlink_to(os.path.join(d, name))
    assert shutil.which("bwrap", path=str(bin_)) is None
    return str(bin_)


DEFERRING = (
    "apiVersion: imagegate/v1\nname: k\nstages:\n"
    "  - id: mods\n    probe: find_spec\n    with: {modules: [json]}\n"
    "  - id: gpu_mods\n    probe: find_spec\n    requires: [gpu]\n    with: {modules: [json]}\n"
)


def test_without_bubblewrap_signing_is_refused_unless_accepted(tmp_path: Path) -> None:
    key, pub = keygen(tmp_path / "k", {}), tmp_path / "k.pub"
    pipe = tmp_path / "p.yaml"
    pipe.write_text(DEFERRING)
    env = {"PATH": _no_bwrap_path(tmp_path)}
    base = ["run", "--here", "--python", sys.executable, "-p", str(pipe), "--key", str(key)]
    refused = imagegate(*base, "-o", str(tmp_path / "refused"), env=env)
    assert refused.returncode == 3, refused.stderr
    said = " ".join(refused.stderr.split())
    assert "--here cannot hide the signing key from the environment under test" in said, said
    assert "bubblewrap (bwrap) is not on PATH" in said and "apt-get install bubblewrap" in said
    assert "--no-sign" in said and "--sign-unisolated" in said
    assert not (tmp_path / "refused").exists()  # stopped before any work

    done = imagegate(*base, "--sign-unisolated", "-o", str(tmp_path / "o"), "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    pred = done.json()["predicate"]
    assert pred["verdict"] == "CPU_PASS_GPU_MODS_DEFERRED"
    assert pred["environment"]["keyIsolation"] == "none"
    isolation = pred["environment"]["key_isolation"]
    assert isolation["signed_anyway"] is True and "bwrap" in isolation["reason"]
    (attempt,) = (tmp_path / "o").glob("*/*/")
    v = imagegate("verify", str(attempt / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 0, v.stdout + v.stderr

    # complete --here: the same refusal before any work, the same way on.
    again = ["complete", str(attempt), "--here", "--python", sys.executable, "--key", str(key)]
    refused = imagegate(*again, env=env)
    assert refused.returncode == 3 and "--sign-unisolated" in refused.stderr, refused.stderr
    assert len(list((tmp_path / "o").glob("*/*/"))) == 1
    completed = imagegate(*again, "--sign-unisolated", env=env)
    assert completed.returncode == 0, completed.stderr
    (later,) = set((tmp_path / "o").glob("*/*/")) - {attempt}
    assert (
        json.loads((later / "statement.json").read_text())["predicate"]["environment"]["keyIsolation"]
        == "none"
    )

    unsigned = imagegate(*base[:-2], "--no-sign", "-o", str(tmp_path / "u"), "--format", "json", env=env)
    assert unsigned.returncode == 0, unsigned.stderr
    assert unsigned.json()["predicate"]["environment"]["key_isolation"]["signed_anyway"] is False


def test_user_namespaces_refused_names_the_sysctl_and_stops(tmp_path: Path) -> None:
    # user.max_user_namespaces is per user namespace: at 0 in a throwaway one, bwrap is refused
    # there exactly as on a host (or in a container) that forbids user namespaces.
    key = keygen(tmp_path / "k", {})
    cmd = [sys.executable, "-m", "imagegate", "run", "--here", "--python", sys.executable, "-p", "python",
           "-m", "json", "--key", str(key), "-o", str(tmp_path / "o")]  # fmt: skip
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    p = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *cmd],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    said = " ".join(p.stderr.split())
    assert p.returncode == 3, p.stderr
    assert "--here cannot hide the signing key" in said and "user.max_user_namespaces = 0" in said, said
    assert not (tmp_path / "o").exists()


def test_the_runner_is_non_dumpable_while_it_holds_a_key(tmp_path: Path) -> None:
    """Defence in depth for every driver: once the key is loaded, a process of the runner's own
    user (here: nobody, so that no capability hides the point) cannot read the runner's /proc."""
    home = Path(tempfile.mkdtemp(prefix="imagegate-nobody-"))  # pytest's folders are root's alone
    home.chmod(0o755)
    key = keygen(home / "k", {})
    os.chown(key, 65534, 65534)
    code = (
        "import os, subprocess, sys\n"
        "from imagegate.cli import _checks\n"
        "def peek():  # another process of this user reads this one's environment\n"
        "    p = subprocess.run(['cat', '/proc/%d/environ' % os.getpid()], capture_output=True, text=True)\n"
        "    return 'read' if p.returncode == 0 else p.stderr.strip()\n"
        "print('before:', peek())\n"
        "_checks.outputs(key=sys.argv[1])\n"
        "print('after:', peek())\n"
    )
    try:
        p = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code, str(key)],
            capture_output=True, text=True, timeout=120, cwd="/", env={**os.environ, "HOME": "/nonexistent"},
        )  # fmt: skip
    finally:
        shutil.rmtree(home)
    assert p.returncode == 0, p.stderr
    assert "before: read" in p.stdout, p.stdout
    assert "after: cat:" in p.stdout and "Permission denied" in p.stdout, p.stdout


def test_sign_unisolated_goes_with_here_only(tmp_path: Path) -> None:
    r = imagegate("run", "example.invalid/app:1", "--sign-unisolated", "--no-sign", "-o", str(tmp_path / "o"))
    assert r.returncode == 3, r.stderr
    assert "--sign-unisolated goes with --here" in r.stderr
    assert not (tmp_path / "o").exists()
