"""Helpers for tests: the real CLI in a subprocess, leftover containers."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

DOCKER_SOCK = "unix:///var/run/docker.sock"
ROOT = Path(__file__).resolve().parents[1]
# "0": a Go tool the tests need and the cache does not hold skips its tests instead of being built
# (.ci/run sets it: a bare machine's builds outlast CI's budget, so they run beside the suite and
# fill the cache for the next run).
BUILD_TOOLS_ENV = "IMAGEGATE_TEST_BUILD_TOOLS"
PODMAN_SOCK = "unix:///run/podman.sock"


def default_signals() -> None:
    """preexec_fn of a child that is interrupted: SIGINT and SIGTERM at their defaults, as in a
    terminal, whatever the test runner inherited (a CI runner, or `cmd &` in a script, may start
    it with SIGINT ignored, and an ignored disposition survives exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def ignore_sigint() -> None:
    """preexec_fn of a child started as such a CI runner starts it: SIGINT ignored."""
    default_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def imagegate(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> Result:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = dict(os.environ, COLUMNS="200")
    full_env.update(env or {})
    p = subprocess.run(
        [sys.executable, "-m", "imagegate", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return Result(p.returncode, p.stdout, p.stderr)


def overall_deadline_s(image: str, tmp: Path) -> int:
    """An overall `--timeout` for a test whose stage must begin before the deadline cuts it:
    three times what a one-stage run of `image` takes here and now (imports, engine, container
    start, the stage), plus 5 s. A busy machine makes every part slower alike, so the stage still
    begins; a fixed figure made such tests fail under load."""
    tmp.mkdir(parents=True, exist_ok=True)
    pipeline = tmp / "deadline-probe.yaml"
    pipeline.write_text(
        "apiVersion: imagegate/v1\nname: start\nstages:\n"
        "  - id: start\n    probe: cli\n    with: {command: [python3, -c, pass]}\n"
    )
    t0 = time.monotonic()
    r = imagegate("run", image, "-p", str(pipeline), "-o", str(tmp / "deadline-probe"), "--no-sign")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    return int(3 * took) + 5


def containers_left(host: str = DOCKER_SOCK, image: str | None = None) -> list[str]:
    """imagegate's containers still present (of one image, if given)."""
    filters = ["--filter", "label=io.imagegate.run"] + (["--filter", f"ancestor={image}"] if image else [])
    out = subprocess.run(
        ["docker", "-H", host, "ps", "-aq", *filters],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def containers_of(attempt: Path) -> list[str]:
    """The containers an attempt ran in (one per controller), as its run.json records them."""
    run = json.loads((attempt / "run.json").read_text())["run"]
    return [str(c["container_id"]) for c in run["controllers"] if c.get("container_id")]


def container_exists(cid: str, host: str = DOCKER_SOCK) -> bool:
    return subprocess.run(["docker", "-H", host, "inspect", cid], capture_output=True).returncode == 0


def controller_output(prep: Any, key: bytes, image: str | None = None, noise: bytes = b"") -> bytes:
    """What the real controller prints for this bundle, as a Pod log shows it (stdout, then
    stderr): run in a real image through the docker driver, or in this environment when `image`
    is None. `noise` stands for lines the image printed itself between the events."""
    from imagegate.drivers.docker import DockerDriver
    from imagegate.drivers.interface import BundleRequest, Driver
    from imagegate.drivers.local import LocalDriver

    driver: Driver = LocalDriver(sys.executable) if image is None else DockerDriver(pull="never")
    facts = driver.resolve(image or "local")
    br = driver.run_bundle(
        BundleRequest(facts, prep.bundle.data, prep.bundle.sha256, prep.interpreters, 120, event_key=key)
    )
    assert br.exit_code == 0, br.stderr
    first, _, rest = br.stdout.strip(b"\n").partition(b"\n")  # after the start event
    return first + b"\n" + noise + rest + b"\n" + br.stderr


def go_tools(*names: str) -> ModuleType:
    """scripts/consumers.py, with these tools (cosign, kyverno, policy-controller, act, kube, kwok,
    kubelet, cni, vault, sigstore, tesseract) built or found in its cache; with IMAGEGATE_TEST_BUILD_TOOLS=0 a tool not built
    yet skips the test that needs it, saying which and how to build it."""
    import pytest

    script = load_script(ROOT / "scripts" / "consumers.py")
    for name in names:
        tool = script.named(name)
        if os.environ.get(BUILD_TOOLS_ENV) == "0" and script.cached(tool) is None:
            pytest.skip(f"{name} {tool.version}: not built yet (scripts/consumers.py build --tool {name})")
        script.build(tool)
    return script


def load_script(path: Path) -> ModuleType:
    """A repository script (scripts/*.py) as a module, to test its functions."""
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    # registered first: a dataclass of the script looks its module up while it is made
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cli_stage(stage_id: str, code: str) -> str:
    """A `cli` stage that runs `python3 -c CODE` in the image (a pipeline_file stage line)."""
    return f'{{id: {stage_id}, probe: cli, timeout: 2m, with: {{command: [python3, -c, "{code}"]}}}}'


def pipeline_file(path: Path, name: str, stages: list[str]) -> Path:
    """A pipeline file made of these stages (one flow-style YAML mapping each), for a test."""
    head = f"apiVersion: imagegate/v1\nkind: Pipeline\nname: {name}\nversion: '1'\nstages:\n"
    path.write_text(head + "".join(f"  - {s}\n" for s in stages))
    return path


def run_test_image(
    name: str, pipeline: dict[str, Any], tmp: Path, timeout: int
) -> tuple[int, dict[str, Any], Path]:
    """Test image `name` built (tests/images/build.py) and `pipeline` run on it, unsigned: the
    exit code, the predicate and the attempt's evidence folder."""
    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parent / "images"))
    import build  # type: ignore[import-not-found]

    image = build.build(name)
    (tmp / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    r = imagegate(
        "run", image, "-p", str(tmp / "pipeline.yaml"), "--format", "json", "--no-sign", "-o", str(tmp / "out"),
        timeout=timeout,
    )  # fmt: skip
    assert r.stdout, r.stderr
    pred = json.loads(r.stdout)["predicate"]
    (attempt,) = (tmp / "out").glob("*/" + pred["attempt"]["id"])
    return r.returncode, pred, attempt


def image_of_its_own(base: str, name: str, folder: Path) -> str:
    """`base` built again with a label of this call's own, tagged NAME:TOKEN: an image ID no other
    test shares, so that pushing it (the engine then lists a registry digest for that ID) changes
    no other test's image."""
    token = secrets.token_hex(4)
    tag = f"{name}:{token}"
    (folder / "ctx").mkdir()
    (folder / "ctx" / "Dockerfile").write_text(f"FROM {base}\nLABEL imagegate.test={token}\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(folder / "ctx")], check=True, capture_output=True)
    return tag


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A server of the test's own on a free port of 127.0.0.1, each request answered by
    `handler` in a thread of its own: its base URL (http://127.0.0.1:PORT). Shut down at the end."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a handler still writing (a flood, a trickle) never holds the end
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
