"""`run --driver rootfs` and its root cache, as an attacker would try it: a cached root is content,
never identity (two images of the same layers, each judged under its own config and digest); a
cache hit never stands in for a layer blob that was not verified (a mirror's tampered layer is
refused, warm or cold); a cache folder that is not the runner's own, or an entry in it that
imagegate did not make, is refused and never used."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.drivers.conftest import push
from tests.helpers import imagegate
from tests.oci.infra import Layout, Registry, skopeo, start_registry

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent"}
# A stage whose outcome depends on the image config's Env, as a real one would on PATH or
# PYTHONPATH: the look-alike's config sets the variable, nothing else differs.
PIPELINE = """\
apiVersion: imagegate/v1
name: env-dependent
stages:
  - id: env_check
    probe: cli
    timeout: 2m
    with:
      command: [python3]
      args: [-c, "import os, sys; sys.exit(3 if os.environ.get('LOOKALIKE_BREAKS_IT') else 0)"]
"""


@pytest.fixture(scope="module")
def pushed_python(images: dict[str, str], registry: Registry) -> str:
    """The python test image pushed by the engine: docker://REF."""
    return "docker://" + push(images["python"], f"{registry.host}/team/python:1")


@pytest.fixture(scope="module")
def layout(pushed_python: str, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """The pushed image as an OCI layout, for surgery."""
    folder = tmp_path_factory.mktemp("python-layout") / "oci"
    skopeo("copy", "-q", "--src-tls-verify=false", pushed_python, f"oci:{folder}")
    return Layout(folder)


def _push(layout: Layout, registry: Registry, name: str) -> str:
    ref = f"{registry.host}/{name}"
    skopeo("copy", "-q", "--dest-tls-verify=false", f"oci:{layout.root}", f"docker://{ref}")
    return f"docker://{ref}"


@pytest.fixture(scope="module")
def lookalike(layout: Layout, registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same layers (the same blobs), a config with one more Env entry."""
    edited = layout.copy(tmp_path_factory.mktemp("lookalike") / "oci")
    config = edited.config()
    config["config"]["Env"] = [*config["config"].get("Env", []), "LOOKALIKE_BREAKS_IT=1"]
    manifest = edited.manifest()
    manifest["config"].update(edited.put_blob(json.dumps(config).encode()))
    edited.set_manifest(manifest)
    return _push(edited, registry, "team/python-lookalike:1")


def _run(ref: str, cache: Path, out: Path, *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    r = imagegate(
        "run", ref, "--driver", "rootfs", "--cache-dir", str(cache), "--no-sign", "--format", "json",
        "-o", str(out), *args, env=NO_ENGINE,
    )  # fmt: skip
    return r.returncode, (r.json() if r.stdout.strip() else {}), r.stderr


def _digests(ref: str) -> tuple[str, str]:
    """(manifest digest, config digest) as the registry serves them."""
    manifest = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", ref))
    return json.loads(skopeo("inspect", "--tls-verify=false", ref))["Digest"], manifest["config"]["digest"]


@pytest.mark.parametrize("lookalike_first", [False, True], ids=["official-first", "lookalike-first"])
def test_images_of_the_same_layers_are_each_judged_under_their_own_config(
    pushed_python: str, lookalike: str, lookalike_first: bool, tmp_path: Path
) -> None:
    pipeline = tmp_path / "env.yaml"
    pipeline.write_text(PIPELINE)
    cache = tmp_path / "cache"
    expected = {pushed_python: ("PASS", 0), lookalike: ("FAIL", 1)}
    order = [lookalike, pushed_python] if lookalike_first else [pushed_python, lookalike]
    for n, ref in enumerate(order):
        code, statement, err = _run(ref, cache, tmp_path / f"out{n}", "-p", str(pipeline))
        verdict, exit_code = expected[ref]
        assert (statement.get("predicate", {}).get("verdict"), code) == (verdict, exit_code), err
        manifest, config = _digests(ref)
        assert statement["subject"][0]["digest"]["sha256"] == manifest.split(":")[1]
        image = statement["predicate"]["image"]
        assert (image["configDigest"], image["manifestDigest"]) == (config, manifest)
        source = statement["predicate"]["environment"]["image_source"]
        assert (source["config_digest"], source["manifest_digest"]) == (config, manifest)
        # The second run reuses the root (the same chainID); every layer vouched for by a pair
        # the first run recorded, and said so.
        assert source["cached"] is (n == 1)
        if n == 1:
            assert {x["verified"] for x in source["layers"]} == {"known_pair"}
            assert all(x["pair_recorded_at"] for x in source["layers"])


def _tampered_layer(blob: bytes) -> bytes:
    """The layer with one more file in it (gzip again): a mirror that slipped code in."""
    raw = io.BytesIO(gzip.decompress(blob))
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=raw, mode="r:") as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for member in src:
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        payload = b"import os\nos.environ['PWNED'] = '1'\n"
        ti = tarfile.TarInfo("usr/lib/python3/dist-packages/sitecustomize.py")
        ti.size = len(payload)
        dst.addfile(ti, io.BytesIO(payload))
    return gzip.compress(out.getvalue(), compresslevel=1, mtime=0)


@pytest.fixture(scope="module")
def tampered_mirror(layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A mirror with the official config blob and its last layer blob replaced, its manifest
    pointing at the new blob's digest and size: (docker://REF, "layer N/N sha256:…" as a refusal
    names the new blob)."""
    base = tmp_path_factory.mktemp("tampered")
    edited = layout.copy(base / "oci")
    manifest = edited.manifest()
    i = len(manifest["layers"]) - 1
    desc = edited.put_blob(_tampered_layer(edited.blob(manifest["layers"][i]["digest"])))
    manifest["layers"][i].update(desc)
    edited.set_manifest(manifest)
    mirror = start_registry(base / "mirror")
    try:
        yield _push(edited, mirror, "team/python:1"), f"layer {i + 1}/{i + 1} {desc['digest'][:19]}…"
    finally:
        mirror.stop()


def _statements(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(p.read_text()) for p in out.rglob("statement.json")]


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_tampered_layer_with_the_official_config_is_refused(
    pushed_python: str, tampered_mirror: tuple[str, str], warm: bool, tmp_path: Path
) -> None:
    ref, label = tampered_mirror
    cache = tmp_path / "cache"
    if warm:  # the official image's root, of the very chainID the mirror's config names
        code, statement, err = _run(pushed_python, cache, tmp_path / "official", "-p", "python")
        assert code == 0 and statement["predicate"]["verdict"] == "PASS", err
    key = tmp_path / "k" / "gate"
    assert imagegate("keygen", "--out", str(key), env={"IMAGEGATE_KEY_PASSWORD": ""}).returncode == 0
    out = tmp_path / "mirror"
    # No layers stage: only the driver can notice the layer, and it must.
    r = imagegate(
        "run", ref, "--driver", "rootfs", "--cache-dir", str(cache), "-p", "python", "--key", f"{key}.key",
        "-o", str(out), env={**NO_ENGINE, "IMAGEGATE_KEY_PASSWORD": ""},
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{label} of {ref}: DIFFID_MISMATCH: content differs" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert all(s["predicate"]["verdict"] != "PASS" for s in _statements(out))
    assert "PASS" not in _signed_verdicts(out)


def _signed_verdicts(out: Path) -> list[str]:
    verdicts = []
    for p in out.rglob("attestation.dsse.json"):
        payload = json.loads(base64.b64decode(json.loads(p.read_text())["payload"]))
        verdicts.append(payload["predicate"]["verdict"])
    return verdicts


# -- the cache folder ---------------------------------------------------------------------------


def _refused(ref: str, cache: Path, tmp_path: Path) -> str:
    code, _, err = _run(ref, cache, tmp_path / "refused", "-p", "python")
    assert code == 3, err
    assert not (tmp_path / "refused").exists() or _statements(tmp_path / "refused") == []
    assert "Traceback" not in err
    return err


def test_a_cache_folder_of_another_user_or_writable_by_others_is_refused(
    pushed_python: str, tmp_path: Path
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    err = _refused(pushed_python, theirs, tmp_path)
    assert f"root cache {theirs}: owned by uid 65534 (nobody), not by uid 0 (root)" in err
    assert "hint: use a folder of your own (--cache-dir or IMAGEGATE_CACHE)" in err
    assert os.listdir(theirs) == []  # nothing written into it
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    err = _refused(pushed_python, shared, tmp_path)
    assert f"root cache {shared}: mode 0770: group/others can write it; not used" in err
    assert f"chmod 700 {shared}" in err and os.listdir(shared) == []


@pytest.fixture(scope="module")
def warm_cache(pushed_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the python image's root (made by a real run)."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    code, _, err = _run(pushed_python, cache, cache.parent / "out", "-p", "python")
    assert code == 0, err
    return cache


@pytest.mark.parametrize("planted", ["rootfs", "root.json"])
def test_a_symlink_planted_in_an_entry_is_refused_never_followed(
    pushed_python: str, warm_cache: Path, planted: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    # cp -a, not copytree: a device node in a root (as older code made them) is copied as a
    # node, never read (copytree reads /dev/full or /dev/zero until the disk is full).
    subprocess.run(["cp", "-a", str(warm_cache), str(cache)], check=True)
    (entry,) = (cache / "roots").iterdir()
    target = entry / planted
    if planted == "rootfs":
        shutil.rmtree(target)
        target.symlink_to("/")
    else:
        shutil.copy(target, tmp_path / "elsewhere.json")
        target.unlink()
        target.symlink_to(tmp_path / "elsewhere.json")
    err = _refused(pushed_python, cache, tmp_path)
    what = "rootfs is a symlink (to /), not a folder" if planted == "rootfs" else "root.json is a symlink"
    assert (
        f"root cache {cache}: roots/{entry.name}: {what}: imagegate did not make this entry; not used" in err
    )
    assert f"imagegate cache remove sha256:{entry.name} --cache-dir {cache}" in err
    assert target.is_symlink()  # left for the user to look at


def test_the_sandbox_never_runs_over_the_hosts_own_root(tmp_path: Path) -> None:
    # The last line of defence behind the cache's checks: a root that is / (however reached).
    from imagegate.drivers import bwrap
    from imagegate.errors import UsageError

    (tmp_path / "rootfs").symlink_to("/")
    for root in (Path("/"), tmp_path / "rootfs"):
        with pytest.raises(
            UsageError, match=rf"the image root {root} is this host's own root folder; not run"
        ):
            bwrap.Sandbox(root, bwrap.ImageConfig()).argv(bwrap.check_host(), ["true"])
