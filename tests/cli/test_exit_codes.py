"""Exit codes as documented, decided once in the entry point: the parser's usage errors are 3
like every other input error, an image that is not there is 3 wherever it was looked for, and an
interrupt is 130 (SIGINT) or 143 (SIGTERM) however the process was started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import container_exists, containers_left, default_signals, ignore_sigint, imagegate

NOT_BUILT = "imagegate-test/never-built-here:1"


@pytest.mark.parametrize(
    ("args", "says", "help_of"),
    [
        (["run", "imagegate-test/python", "--pipline", "x"], "no such option: --pipline", "imagegate run"),
        (
            ["run", "imagegate-test/python", "--pipeline"],
            "'--pipeline' requires an argument",
            "imagegate run",
        ),
        (
            ["run", "imagegate-test/python", "--format", "xml"],
            "invalid value for '--format'",
            "imagegate run",
        ),
        (
            ["run", "imagegate-test/python", "--timeout", "abc"],
            "invalid value for '--timeout'",
            "imagegate run",
        ),
        (["run", "imagegate-test/python", "--key"], "'--key' requires an argument", "imagegate run"),
        (["run", "a", "b"], "unexpected extra argument", "imagegate run"),
        (["layers"], "missing argument", "imagegate layers"),
        (
            ["layers", "docker-daemon:x", "--format", "yaml"],
            "invalid value for '--format'",
            "imagegate layers",
        ),
        (["pipelines", "list", "--bad"], "no such option: --bad", "imagegate pipelines list"),
        (["nosuchcommand"], "no such command 'nosuchcommand'", "imagegate"),
    ],
)
def test_parser_usage_errors_speak_as_every_error_and_exit_3(
    args: list[str], says: str, help_of: str, tmp_path: Path
) -> None:
    """The parser's own errors read as every other error: one line `imagegate: error: …` and a
    hint naming the help to read (under the program's name, however it was started), not the
    parser's usage block; exit 3."""
    r = imagegate(*args, cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "no-config")})  # no key
    assert r.returncode == 3, r.stderr
    error, hint = r.stderr.splitlines()
    assert error.startswith("imagegate: error: ") and says in error, r.stderr
    assert hint.startswith(f"  hint: {help_of} --help "), r.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_an_input_error_of_ours_exits_3_with_its_hint(tmp_path: Path) -> None:
    # An empty config folder: verify with no --key would take run's key from the shared one.
    r = imagegate(
        "verify", "statement.json", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    )
    assert r.returncode == 3, r.stderr
    assert "imagegate: error: no public key to verify with" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_and_version_still_answer(tmp_path: Path) -> None:
    assert imagegate("run", "--help", cwd=tmp_path).stdout.startswith("Usage: ")
    assert imagegate("--version", cwd=tmp_path).returncode == 0
    group = imagegate("pipelines", cwd=tmp_path)  # a group named alone shows its help
    assert "list" in group.stderr and "imagegate: error" not in group.stderr


def test_a_short_name_the_engine_lacks_says_so_first(engine: str, tmp_path: Path) -> None:
    """No internet here: the engine's pull from Docker Hub fails; the user must read first that
    the image is not in the engine (a typo, not built yet), then why the pull did not help."""
    r = imagegate("run", "nosuchimage-imagegate", "-p", "python", "--no-sign", "-o", str(tmp_path))
    assert r.returncode == 3, r.stderr
    first = r.stderr.index("not found in the docker engine")
    assert first < r.stderr.index("pull")  # the pull is named after the cause
    assert "image nosuchimage-imagegate: not found in the docker engine, and pulling it failed:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.glob("*/*"))


def test_image_not_found_is_3_for_every_source(engine: str, tmp_path: Path) -> None:
    for args in (
        ["run", NOT_BUILT, "-p", "python", "--pull", "never", "--no-sign", "-o", str(tmp_path)],
        ["layers", f"docker-daemon:{NOT_BUILT}"],
        ["compare", f"docker-daemon:{NOT_BUILT}", f"docker-daemon:{NOT_BUILT}"],
    ):
        r = imagegate(*args)
        assert r.returncode == 3, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_verify_image_of_a_local_name_is_an_input_error_at_once(engine: str, tmp_path: Path) -> None:
    """A locally built image was never in a registry: say so, exit 3, without minutes of retries
    against Docker Hub (which a bare name means to a registry client)."""
    import io
    import tarfile

    from imagegate.attest import keys

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = str(time.time_ns()).encode()  # an image of its own: no other run pushes it meanwhile
        info = tarfile.TarInfo("stamp")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ref = f"imagegate-test/local-only:{time.time_ns()}"
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True)
    try:
        _, pub = keys.write_keypair(tmp_path / "k", keys.generate(), None)
        t0 = time.monotonic()
        r = imagegate("verify", "--image", ref, "--key", str(pub))
        assert r.returncode == 3, r.stdout + r.stderr
        assert f"image {ref}: only in the local engine" in r.stderr
        assert "never pushed" in r.stderr
        assert time.monotonic() - t0 < 10
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)


def _slow_pipeline(tmp_path: Path, token: str) -> str:
    path = tmp_path / "slow.yaml"
    path.write_text(
        "apiVersion: imagegate/v1\nname: t\nstages:\n"
        f"  - id: slow\n    probe: cli\n    with: {{command: [python3, -c, 'import time; time.sleep({token})']}}\n"
    )
    return str(path)


def _ours(before: set[str], token: str) -> set[str]:
    """The containers of this run: the engine is shared, so others come and go meanwhile; ours
    runs the stage command carrying `token`."""
    found = set()
    for cid in set(containers_left()) - before:
        top = subprocess.run(["docker", "top", cid, "-eo", "pid,args"], capture_output=True, text=True)
        if token in top.stdout:
            found.add(cid)
    return found


@pytest.mark.signals
@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
@pytest.mark.parametrize("inherited", ["default", "SIGINT-ignored"])
def test_interrupt_removes_the_container_and_exits_with_the_signal_code(
    images: dict[str, str], tmp_path: Path, sig: signal.Signals, code: int, inherited: str
) -> None:
    token = f"600.{time.time_ns() % 10**9}"  # a sleep of 10 minutes no other run has
    before = set(containers_left())
    pipeline = _slow_pipeline(tmp_path, token)
    argv = ["run", images["python"], "-p", pipeline, "-o", str(tmp_path), "--no-sign"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "imagegate", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if inherited == "SIGINT-ignored" else default_signals,
    )
    ours: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while not (ours := _ours(before, token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ours, "the run never started a container"
        time.sleep(1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err
        assert "interrupted" in err
        assert not any(container_exists(c) for c in ours)
    finally:
        # Whatever failed above, leave no run and no container behind.
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        for cid in ours:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


# An interrupt that lands inside exec() of a string, as it does when it comes while dataclasses or
# namedtuple build a class at import: run as `python -m`, the way tests and many users start it.
TRIGGER = """\
import imagegate.cli as cli

def run_main(argv=None):
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIG{sig})\\nfor _ in range(10**9): pass")
    return 0

cli.run_main = run_main
cli.main([])
"""


@pytest.mark.parametrize(("sig", "code"), [("INT", 130), ("TERM", 143)])
def test_an_interrupt_inside_exec_while_importing_still_exits_with_its_code(
    tmp_path: Path, sig: str, code: int
) -> None:
    """CPython's `python -m` path ends the process by SIGINT (exit -2) once a KeyboardInterrupt
    was raised inside exec() of a string, even one caught; the interrupt's own code must stand."""
    (tmp_path / "trigger").mkdir()
    (tmp_path / "trigger" / "__main__.py").write_text(TRIGGER.replace("{sig}", sig))
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{src}")
    p = subprocess.run([sys.executable, "-m", "trigger"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == code, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "imagegate: interrupted", p.stderr
