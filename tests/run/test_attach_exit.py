"""Exit codes never hide a missing signature: `run --attach` (and `complete --attach`) with no key
to sign with is refused before the run (exit 3: nothing run, no attempt written), where without
--attach it goes on unsigned; and the image's digest is read once, before anything is signed, so
a tag moved while the run ran is refused with nothing signed or attached (exit 2), the
statements of a run whose tag held going to that digest (exit 0). The real engine and a real
registry on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from imagegate.attest import attach
from tests.helpers import imagegate
from tests.oci.infra import Registry, start_registry

pytestmark = pytest.mark.engine

# One stage, long enough for the test to move the tag while it runs.
PIPELINE = """apiVersion: imagegate/v1
name: slow
stages:
  - id: slow
    probe: cli
    with: {command: [python3, -c, "import time; time.sleep(8); print('done')"], stdout_regex: "^done$"}
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("attach-registry"))
    yield reg
    reg.stop()


@pytest.fixture
def pushed(images: dict[str, str], registry: Registry) -> Iterator[tuple[str, str]]:
    """The python image as `REPO:1` and the conflict image as `REPO:2`, in one repository."""
    repo = f"{registry.host}/imagegate/moved"
    for tag, name in (("1", "python"), ("2", "conflict")):
        subprocess.run(["docker", "tag", images[name], f"{repo}:{tag}"], check=True)
        subprocess.run(["docker", "push", "-q", f"{repo}:{tag}"], check=True, capture_output=True)
    try:
        yield f"{repo}:1", f"{repo}:2"
    finally:
        subprocess.run(["docker", "rmi", f"{repo}:1", f"{repo}:2"], capture_output=True)


def _digest(ref: str) -> str:
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return attach.resolve(client, parsed).digests[0]


def _attached_to(ref: str, digest: str) -> bool:
    """Whether anything is attached to `digest`: its `.att` tag or its referrers fallback tag."""
    parsed = attach.parse_image(ref)
    url = f"http://{parsed.registry}/v2/{parsed.repository}/manifests"
    tags = (attach.attestation_tag(digest), attach.attestation_tag(digest).removesuffix(".att"))
    return any(httpx.head(f"{url}/{tag}", timeout=10).status_code != 404 for tag in tags)


def _keygen(tmp_path: Path) -> Path:
    assert imagegate("keygen", "--out", str(tmp_path / "gate")).returncode == 0
    return tmp_path / "gate"


def _no_key_folder(tmp_path: Path) -> dict[str, str]:
    """No key named, and the default key's folder would have to be inside a file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    return {"XDG_CONFIG_HOME": str(blocker / "config"), "IMAGEGATE_SIGNING_KEY": ""}


def test_attach_with_nothing_to_sign_with_is_refused_before_the_run(
    pushed: tuple[str, str], tmp_path: Path
) -> None:
    ref, _ = pushed
    env, out = _no_key_folder(tmp_path), tmp_path / "o"
    run = imagegate("run", ref, "-p", "python", "-m", "json", "-o", str(out), "--attach", env=env)
    # complete refuses as early: before its earlier attempt is even read
    done = imagegate("complete", str(tmp_path / "earlier"), "--attach", "--trust", "x.pub", env=env)
    for r in (run, done):
        assert r.returncode == 3, r.stdout + r.stderr
        assert (
            "--attach pushes signed statements, and nothing can sign them: no signing key, and none "
            in r.stderr
        )
        assert "pass --key PATH or set IMAGEGATE_SIGNING_KEY" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()  # nothing run
    assert not _attached_to(ref, _digest(ref))
    # Without --attach the same run goes on unsigned, as before, and says so.
    unsigned = imagegate("run", ref, "-p", "python", "-m", "json", "-o", str(out), env=env)
    assert unsigned.returncode == 0 and "the attempt will not be signed" in unsigned.stderr, unsigned.stderr


def test_a_tag_moved_while_the_run_ran_is_refused_before_anything_is_signed(
    pushed: tuple[str, str], tmp_path: Path
) -> None:
    ref, other = pushed
    ran, moved = _digest(ref), _digest(other)
    key, pipeline = _keygen(tmp_path), tmp_path / "slow.yaml"
    pipeline.write_text(PIPELINE)
    args = ["run", ref, "-p", str(pipeline), "-o", str(tmp_path / "o"), "--key", f"{key}.key", "--attach"]
    p = subprocess.Popen(
        [sys.executable, "-m", "imagegate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stderr is not None
        head = list(_until(p.stderr, " stages in "))
        _move(ref, other)  # while the stage sleeps: the image ran is no longer what the tag names
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = "".join(head) + err
    assert p.returncode == 2, out + err
    assert f"names {moved} in its registry now, not the image this run judged ({ran}): nothing signed" in err
    assert "signed " not in err.replace("nothing signed", "") and "Traceback" not in err
    (attempt,) = (tmp_path / "o").glob("*/*/statement.json")
    assert not (attempt.parent / "attestation.dsse.json").exists()
    assert not _attached_to(ref, ran) and not _attached_to(ref, moved)
    # The tag back where it was and holding, the same run attaches to the digest it read, exit 0.
    _move(ref, f"{ref.rpartition(':')[0]}@{ran}")
    again = imagegate(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"attached to {ref.rpartition(':')[0]}@{ran}" in again.stderr
    v = imagegate("verify", "--image", ref, "--key", f"{key}.pub", "--expect-verdict", "PASS")
    assert v.returncode == 0, v.stdout + v.stderr


def _until(lines: Iterator[str], marker: str) -> Iterator[str]:
    for line in lines:
        yield line
        if marker in line:
            return
    raise AssertionError(f"the run ended before saying {marker!r}")


def _move(ref: str, to: str) -> None:
    """Point `ref`'s tag at the manifest `to` names (same repository), as a push would."""
    parsed, target = attach.parse_image(ref), attach.parse_image(to)
    with attach.client_for(parsed) as client:
        got = client.get_manifest(target.repository, target.ref)
        client.put_manifest(parsed.repository, parsed.ref, got.raw, got.media_type)
