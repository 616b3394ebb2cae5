#!/usr/bin/env python3
"""Build the test images from Debian packages and real PyPI wheels, offline inside the build.

Each image is tagged `imagegate-test/NAME:latest` and `imagegate-test/NAME:<recipe hash>`; an
image whose hash tag exists is not rebuilt, so a warm machine starts in seconds and a fresh one
builds everything from nothing. Wheels are downloaded on the host (`pip download`) into a cache
and installed with `pip install --no-index` during `docker build --network none`.

The real frameworks (REAL_RECIPES: the newest vLLM and SGLang, built the ordinary way with
`pip install FRAMEWORK==X av` on the Debian base) resolve their whole dependency set: the host
downloads it (`pip wheel`, the machine's own pip configuration ignored so that nothing but PyPI's
releases go in), serves the folder on 127.0.0.1 for the duration of the build, and the image's own
pip installs from there in one `RUN` (`docker build --network host`), so that no copy of the
wheels stays in a layer.

Usage: build.py [NAME ...]    (default: every image the blocking test suite runs)
       build.py --all          (those and the CONFORMANCE images: the SGLang ones)
       build.py --no-real      (RECIPES only)    build.py --real    (the default's REAL_RECIPES)
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("IMAGEGATE_TEST_CACHE", Path.home() / ".cache" / "imagegate-test"))
PY_TAGS = ["--implementation", "cp", "--only-binary=:all:"]
PYTHON = "3.11"  # the Python of Debian 12, the default base; a recipe's "python" overrides it
SUITE = "bookworm"  # a recipe's "suite" overrides it
PIP_ARGS = "--no-index --no-deps --break-system-packages"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"]

# name -> recipe. "base" images come from mmdebstrap; the others build FROM another one.
RECIPES: dict[str, dict] = {
    "python": {"debian": ["python3", "python3-pip"]},
    # Real broken dependency set: nixl 1.2.0 requires nixl-cu12 and nixl-cu13 (not installed);
    # moviepy 2.2.1 requires pillow<12.0,>=9.2.0 but pillow 12.2.0 is installed.
    "conflict": {"from": "python", "wheels": ["moviepy==2.2.1", "pillow==12.2.0", "nixl==1.2.0"]},
    "av": {"from": "python", "wheels": ["av==14.2.0"]},
    "nopip": {
        "from": "python",
        "run": "rm -rf /usr/lib/python3/dist-packages/pip /usr/lib/python3/dist-packages/pip-*",
    },
    # An imitation of vLLM (tests/images/vllm_imitation, named as such) whose parser fails without
    # a GPU the way vLLM >= 0.9 does, plus real PyAV.
    "vllm-like": {"from": "python", "wheels": ["av==14.2.0"], "local": ["vllm_imitation"]},
    # Releases with advisories in the PyPA advisory database (pillow < 10.0.0, requests < 2.31.0),
    # with requests' dependencies of that time so that the image's pip check passes.
    "vulnerable": {
        "from": "python",
        "wheels": [
            "pillow==9.5.0",
            "requests==2.25.1",
            "chardet==4.0.0",
            "idna==2.10",
            "urllib3==1.26.5",
            "certifi==2021.5.30",
        ],
    },
    # Current releases only: Debian's pip 23.0.1 has an advisory, so a current pip replaces it.
    "clean-current": {
        "from": "python",
        "wheels": [
            "pillow==12.2.0",
            "requests==2.34.2",
            "charset-normalizer==3.5.3",
            "idna==3.20",
            "urllib3==2.8.0",
            "certifi==2026.10.19.post1",
            "pip==26.3",
        ],
        "run": "rm -rf /usr/lib/python3/dist-packages/pip /usr/lib/python3/dist-packages/pip-*",
    },
    # No interpreter at all: one text file.
    "nopython": {"scratch": True},
    # Hostile images for the trust tests (tests/images/hostile/README.md): a package that tries
    # every route to forge other stages' results, a site hook that prints forged events, a real
    # unmet requirement; a python3 that prints a forged, unterminated event line first; a python3
    # that floods stdout with 400 MB first.
    "hostile": {"from": "python", "copy": "hostile"},
    "hostile-wrapper": {"from": "hostile", "copy": "hostile-wrapper"},
    # A python3 that makes the controller see a GPU the runner never granted (a device file of
    # its own, the visibility variables set): no GPU level may rest on that word.
    "hostile-gpu": {"from": "python", "copy": "hostile-gpu"},
    "flood": {"from": "python", "copy": "flood"},
    # A multi-GB image (three 1 GiB layers of random bytes, which no compression shrinks) for the
    # tests that stop a run in each phase of reading it: an engine's export, a registry's blobs,
    # the hashing (tests/run/test_interrupt_phases.py).
    "big": {
        "from": "python",
        "run": [f"head -c 1G /dev/urandom > /big-{i}" for i in (1, 2, 3)],
    },
    # The oldest Python the probes support that the reachable registries provide: Debian 11's
    # Python 3.9 (no Debian suite on the mirror, no PyPI or npm package ships an older CPython
    # build), with Debian 11's Python 2.7 beside it for the loader's too-old message.
    "oldest": {"debian": ["python3", "python3-pip", "python2.7"], "suite": "bullseye"},
    # The vLLM imitation and real PyAV on that Python; Debian 11's pip 20.3 predates
    # --break-system-packages.
    "oldest-vllm-like": {
        "from": "oldest",
        "python": "3.9",
        "wheels": ["av==14.2.0"],
        "local": ["vllm_imitation"],
        "pip_args": "--no-index --no-deps",
    },
}

# The newest release of each framework, installed the ordinary way (whole dependency set from
# PyPI, CUDA torch included: ~10 GB each). Kept apart from RECIPES so that the `images` fixture
# of the fast tests never waits for them; tests/real builds them, and so does the set-up (all but
# the CONFORMANCE ones).
REAL_RECIPES: dict[str, dict] = {
    "vllm": {"from": "python", "pip": ["vllm==0.33.0", "av"]},
    "sglang": {"from": "python", "pip": ["sglang==0.5.23", "av"]},
    # What prefill/decode disaggregation adds: NIXL (`pip install nixl` picks 1.5.1 on Python
    # 3.11, the newest with both of its CUDA variants, nixl-cu12 and nixl-cu13).
    "sglang-nixl": {"from": "sglang", "pip": ["nixl==1.5.1"]},
    # NIXL without the variant for this torch's CUDA 13: importing nixl raises ImportError.
    "sglang-nixl-cu12-only": {
        "from": "sglang-nixl",
        "run": "python3 -m pip uninstall -q -y --break-system-packages nixl-cu13",
    },
    # A real OpenAI-compatible server on CPU for the serve stage: `transformers serve` (the vLLM
    # image carries transformers, torch, fastapi, uvicorn; accelerate is the one wheel it lacks),
    # a tiny random-weight model made offline at build time, and a test wrapper imitating server
    # bugs (tests/images/transformers-serve/README.md).
    "transformers-serve": {
        "from": "vllm",
        "wheels": ["accelerate==1.15.0"],
        "copy": "transformers-serve",
        "run": "python3 /opt/imagegate-test/tiny_models.py /models && chmod -R a+rX /models",
    },
}


# Images only the conformance tests (`pytest -m conformance`, scripts/conformance.sh) run: the
# blocking CI builds the vLLM image (the real serve stage's server is built on it) and leaves
# these 11 GB out of a bare machine's set-up.
CONFORMANCE = ("sglang", "sglang-nixl", "sglang-nixl-cu12-only")


def recipe(name: str) -> dict:
    return RECIPES.get(name) or REAL_RECIPES[name]


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(argv)[:200], file=sys.stderr, flush=True)
    return subprocess.run(argv, check=True, **kw)


def image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def recipe_hash(name: str, r: dict | None = None) -> str:
    r = r or recipe(name)
    h = hashlib.sha256(json.dumps(r, sort_keys=True).encode())
    if "from" in r:
        h.update(recipe_hash(r["from"]).encode())
    for local in r.get("local", []):
        h.update(tree_digest(HERE / local).encode())
    if "copy" in r:
        h.update(tree_digest(HERE / r["copy"]).encode())
    return h.hexdigest()[:16]


def debian_mirrors(suite: str = SUITE) -> list[str]:
    """deb lines from the machine's own deb822 sources (never a host name written here), for
    `suite` (the machine's own suite names, e.g. bookworm-security, renamed to it)."""
    lines = []
    for src in Path("/etc/apt/sources.list.d").glob("*.sources"):
        stanza: dict[str, str] = {}
        for raw in [*src.read_text().splitlines(), ""]:
            if not raw.strip():
                if stanza.get("types", "").startswith("deb") and "uris" in stanza:
                    for own in stanza.get("suites", SUITE).split():
                        name = suite + own[len(own.split("-")[0]) :]
                        lines.append(
                            f"deb {stanza['uris'].split()[0]} {name} {stanza.get('components', 'main')}"
                        )
                stanza = {}
            elif not raw.startswith("#") and ":" in raw:
                k, v = raw.split(":", 1)
                stanza[k.strip().lower()] = v.strip()
    return lines


def build_debian(name: str, tag: str) -> None:
    r = recipe(name)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        suite = r.get("suite", SUITE)
        mirrors = debian_mirrors(suite)
        sh(
            "mmdebstrap",
            "--quiet",
            "--variant=apt",
            "--include=" + ",".join(r["debian"]),
            suite,
            str(rootfs),
            *mirrors,
        )
        sh(
            "docker", "import",
            "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", 'CMD ["python3"]',
            str(rootfs), tag,
        )  # fmt: skip


def local_wheel(src: Path, out: Path) -> Path:
    """A wheel built by hand from a source tree (deterministic, no build backend needed)."""
    pkg = next(p for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    version = "0.11.0"
    dist = f"{pkg.name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for p in sorted(pkg.rglob("*.py")):
        files[str(p.relative_to(src))] = p.read_bytes()
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {pkg.name}\nVersion: {version}\n"
        "Summary: imitation of vLLM's device inference, for imagegate tests (not vLLM)\n"
    ).encode()
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: imagegate-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist}/entry_points.txt"] = b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
    record = io.StringIO()
    for n, data in files.items():
        import base64

        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{n},sha256={d},{len(data)}\n")
    record.write(f"{dist}/RECORD,,\n")
    files[f"{dist}/RECORD"] = record.getvalue().encode()
    path = out / f"{pkg.name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in files.items():
            zf.writestr(zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return path


PIP_LOCATION_NOISE = re.compile(
    r"^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$"
)


def download_wheels(reqs: list[str], python: str = PYTHON) -> list[Path]:
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--python-version", python]
    argv += [*PY_TAGS, *platforms]
    print("+", " ".join([*argv, "-d", str(wheels), *reqs])[:200], file=sys.stderr, flush=True)
    done = subprocess.run([*argv, "-d", str(wheels), *reqs], capture_output=True, text=True)
    # A host's pip configuration may list index folders that lack most projects: pip warns once
    # per project and folder ("WARNING: Location ... is ignored"), which buries what matters.
    kept = [ln for ln in done.stderr.splitlines() if not PIP_LOCATION_NOISE.match(ln)]
    if kept:
        print("\n".join(kept), file=sys.stderr, flush=True)
    if done.returncode != 0:
        raise SystemExit(f"build.py: pip download failed (exit {done.returncode}) for {' '.join(reqs)}")
    found = []
    for req in reqs:
        name, _, ver = req.partition("==")
        stem = name.replace("-", "_").lower()
        # the cache holds wheels for several Pythons: take the one this recipe's Python installs
        cp = "cp" + python.replace(".", "")
        matches = [
            p
            for p in wheels.glob("*.whl")
            if p.name.lower().startswith(f"{stem}-{ver}-") and p.name.split("-")[-3] in (cp, "py3", "py2.py3")
        ]
        if not matches:
            raise SystemExit(f"build.py: no wheel for {req} in {wheels}")
        found.append(matches[0])
    return found


def host_pip_env() -> dict[str, str]:
    """The environment for the host's pip: this machine's pip configuration (extra indexes,
    find-links folders, constraints) left out, so that the image gets PyPI's releases."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """An HTTP listing of `folder` on 127.0.0.1 (pip's --find-links reads it) while in use."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_pip(r: dict, tag: str) -> None:
    """`pip install REQS` in one RUN on the base image, from wheels the host downloaded."""
    base = f"imagegate-test/{r['from']}:{recipe_hash(r['from'])}"
    # The host resolves what the base's own pip installs too, so that the image's pip finds the
    # versions it already has among the offered wheels.
    host_reqs, up = list(r["pip"]), recipe(r["from"])
    while "pip" in up:
        host_reqs += up["pip"]
        up = recipe(up["from"])
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        wheels = Path(tmp) / "wheels"
        sh(
            sys.executable, "-m", "pip", "wheel", "-q", "--progress-bar", "off",
            "-w", str(wheels), *host_reqs,
            env=host_pip_env(),
        )  # fmt: skip
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        with serve(wheels) as url:
            reqs = " ".join(f"'{q}'" for q in r["pip"])
            (ctx / "Dockerfile").write_text(
                f"FROM {base}\n"
                "RUN python3 -m pip install -q --no-cache-dir --break-system-packages"
                f" --no-index --find-links {url} {reqs}\n"
            )
            # --force-rm: a failed install leaves no container of gigabytes behind
            sh(
                "docker", "build", "-q", "--force-rm", "--network", "host", "-t", tag, str(ctx),
                env=dict(os.environ, DOCKER_BUILDKIT="0"),
            )  # fmt: skip


def build_derived(name: str, tag: str) -> None:
    r = recipe(name)
    base = f"imagegate-test/{r['from']}:{recipe_hash(r['from'])}"
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        (ctx / "wheels").mkdir()
        lines = [f"FROM {base}"]
        if r.get("wheels") or r.get("local"):
            for w in download_wheels(r.get("wheels", []), r.get("python", PYTHON)):
                (ctx / "wheels" / w.name).write_bytes(w.read_bytes())
            for local in r.get("local", []):
                local_wheel(HERE / local, ctx / "wheels")
            lines += [
                "COPY wheels/ /tmp/wheels/",
                f"RUN python3 -m pip install -q {r.get('pip_args', PIP_ARGS)} /tmp/wheels/*.whl"
                " && rm -rf /tmp/wheels /root/.cache",
            ]
        if r.get("copy"):  # a tree laid over the image's root (its README stays here)
            shutil.copytree(HERE / r["copy"], ctx / "root", ignore=shutil.ignore_patterns("README.md"))
            lines.append("COPY root/ /")
        runs = r.get("run") or []
        lines += [f"RUN {run}" for run in ([runs] if isinstance(runs, str) else runs)]  # a layer each
        (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
        sh(
            "docker",
            "build",
            "-q",
            "--network",
            "none",
            "-t",
            tag,
            str(ctx),
            env=dict(os.environ, DOCKER_BUILDKIT="0"),
        )


def build_scratch(tag: str) -> None:
    buf = io.BytesIO()
    import tarfile

    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b"an image with no interpreter, for imagegate tests\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    sh("docker", "import", "--change", 'CMD ["/nothing"]', "-", tag, input=buf.getvalue())


@contextmanager
def _building(name: str) -> Iterator[None]:
    """One builder of an image at a time, across processes: a test that needs an image CI is
    still building in the background waits for it instead of building it a second time."""
    locks = CACHE / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(name: str, r: dict | None = None) -> str:
    """Build image `name` from its recipe (or the recipe `r`), unless its hash tag exists."""
    r = r or recipe(name)
    tag = f"imagegate-test/{name}:{recipe_hash(name, r)}"
    with _building(name):
        _build(name, r, tag)
    sh("docker", "tag", tag, f"imagegate-test/{name}:latest")
    return tag


def _build(name: str, r: dict, tag: str) -> None:
    if not image_exists(tag):
        if "pip" in r:
            build(r["from"])
            CACHE.mkdir(parents=True, exist_ok=True)
            build_pip(r, tag)
        elif "from" in r:
            build(r["from"])
            build_derived(name, tag)
        elif r.get("scratch"):
            build_scratch(tag)
        else:
            build_debian(name, tag)


def main(argv: list[str]) -> int:
    known = {**RECIPES, **REAL_RECIPES}
    if argv == ["--all"]:
        argv = list(known)
    elif argv == ["--no-real"]:  # CI builds the real ones beside its tests
        argv = list(RECIPES)
    elif argv == ["--real"]:
        argv = [n for n in REAL_RECIPES if n not in CONFORMANCE]
    for name in argv or [n for n in known if n not in CONFORMANCE]:
        if name not in known:
            print(f"build.py: unknown image {name!r}; known: {', '.join(known)} (or --all)", file=sys.stderr)
            return 3
        build(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
