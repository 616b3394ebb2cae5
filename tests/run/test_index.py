"""Statements about a multi-platform index (`imagegate index`): admission resolves a tag to the
index digest, a run judges one platform. Real parts: a registry on loopback holding an index of
two platform images and a buildx-style attestation manifest, real signed runs of each platform
manifest (the rootfs driver, by digest: the arm64 manifest's config says arm64, its layers are
this host's, so it runs here), the real CLI, and the shipped Kyverno policy judging what a
controller reads for the tag."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate._support import resources
from imagegate.attest import keys
from tests.helpers import imagegate
from tests.oci.infra import (
    DOCKER_MANIFEST_TYPE,
    OCI_INDEX_TYPE,
    Registry,
    push_two_platforms,
    sh,
    sha,
    start_registry,
    urljoin_registry,
)
from tests.policies import several
from tests.policies.admission import not_before, pod

pytestmark = pytest.mark.engine

INDEX_TYPE = "https://imagegate.dev/attestations/index/v1"
OCI_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Index:
    ref: str  # registry/repository:tag naming the index
    digest: str
    amd64: str  # manifest digests
    arm64: str
    attestation: str  # the buildx-style attestation manifest the index lists

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]


def _put_blob(http: httpx.Client, registry: Registry, repository: str, data: bytes) -> dict[str, Any]:
    upload = http.post(f"http://{registry.host}/v2/{repository}/blobs/uploads/")
    upload.raise_for_status()
    location = urljoin_registry(registry, upload.headers["Location"])
    sep = "&" if "?" in location else "?"
    http.put(f"{location}{sep}digest={sha(data)}", content=data).raise_for_status()
    return {"digest": sha(data), "size": len(data)}


def _with_attestation(registry: Registry, repository: str, amd64: str, arm64: str, tag: str) -> Index:
    """An index of the two platform manifests and an attestation manifest for the amd64 one, as
    buildx writes it (platform unknown/unknown, vnd.docker.reference.type)."""
    base = f"http://{registry.host}/v2/{repository}"
    with httpx.Client(timeout=60) as http:
        config = _put_blob(http, registry, repository, b"{}")
        layer = _put_blob(http, registry, repository, b'{"_type": "https://in-toto.io/Statement/v0.1"}')
        att = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST_TYPE,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.in-toto+json", **layer}],
            }
        ).encode()
        headers = {"Content-Type": OCI_MANIFEST_TYPE}
        http.put(f"{base}/manifests/{sha(att)}", content=att, headers=headers).raise_for_status()
        entries = []
        for digest, arch in (
            (amd64, {"architecture": "amd64"}),
            (arm64, {"architecture": "arm64", "variant": "v8"}),
        ):
            raw = http.get(f"{base}/manifests/{digest}", headers={"Accept": DOCKER_MANIFEST_TYPE}).content
            entries.append(
                {
                    "mediaType": DOCKER_MANIFEST_TYPE,
                    "digest": digest,
                    "size": len(raw),
                    "platform": {"os": "linux", **arch},
                }
            )
        entries.append(
            {
                "mediaType": OCI_MANIFEST_TYPE,
                "digest": sha(att),
                "size": len(att),
                "platform": {"os": "unknown", "architecture": "unknown"},
                "annotations": {
                    "vnd.docker.reference.type": "attestation-manifest",
                    "vnd.docker.reference.digest": amd64,
                },
            }
        )
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX_TYPE, "manifests": entries}).encode()
        http.put(
            f"{base}/manifests/{tag}", content=index, headers={"Content-Type": OCI_INDEX_TYPE}
        ).raise_for_status()
    return Index(f"{registry.host}/{repository}:{tag}", sha(index), amd64, arm64, sha(att))


@dataclass(frozen=True)
class World:
    good: Index  # python for both platforms
    mixed: Index  # python for amd64, the conflicting image for arm64


def _manifest_of(registry: Registry, image: str, repository: str, tag: str) -> str:
    ref = f"{registry.host}/{repository}:{tag}"
    sh("docker", "tag", image, ref)
    try:
        sh("docker", "push", "-q", ref)
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)
    got = httpx.head(
        f"http://{registry.host}/v2/{repository}/manifests/{tag}", headers={"Accept": DOCKER_MANIFEST_TYPE}
    )
    got.raise_for_status()
    return str(got.headers["Docker-Content-Digest"])


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("keys") / "gate"
    assert imagegate("keygen", "--out", str(key)).returncode == 0
    return key


def _run(ref: str, out: Path, key: Path, cache: Path, pipeline: str = "python") -> Path:
    """A signed run of `ref` (repo@digest) with the rootfs driver; its attempt folder."""
    env = {"DOCKER_HOST": "unix:///nonexistent", "XDG_CACHE_HOME": str(cache)}
    r = imagegate(
        "run", f"docker://{ref}", "-p", pipeline, "--driver", "rootfs", "-o", str(out), "--key", f"{key}.key", env=env
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stdout + r.stderr
    (folder,) = [p.parent for p in out.glob("sha256-*/*/attestation.dsse.json")]
    return folder


@pytest.fixture(scope="module")
def world(
    images: dict[str, str], keypair: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, dict[str, Path]]]:
    """The indexes in a registry of this module's own, and one signed run of each platform
    manifest (and of an image the indexes do not list)."""
    tmp = tmp_path_factory.mktemp("index")
    registry = start_registry(tmp / "registry")
    try:
        two = push_two_platforms(registry, images["python"], "team/multi", tag="plain")
        good = _with_attestation(registry, "team/multi", two.amd64_digest, two.arm64_digest, "1")
        conflict = _manifest_of(registry, images["conflict"], "team/multi", "conflict")
        mixed = _with_attestation(registry, "team/multi", two.amd64_digest, conflict, "mixed")
        other = _manifest_of(registry, images["conflict"], "team/other", "1")
        cache = tmp / "cache"
        runs = {
            name: _run(f"{registry.host}/{repo}@{digest}", tmp / f"runs-{name}", keypair, cache)
            for name, repo, digest in (
                ("amd64", "team/multi", two.amd64_digest),
                ("arm64", "team/multi", two.arm64_digest),
                ("arm64-fail", "team/multi", conflict),
                ("other", "team/other", other),
            )
        }
        # the same checks from another pipeline file: another sha256, so no conjunction with the rest
        other_pipeline = tmp / "python-copy.yaml"
        other_pipeline.write_text((resources.pipelines_dir() / "python.yaml").read_text() + "# a copy\n")
        runs["arm64-other-pipeline"] = _run(
            f"{registry.host}/team/multi@{two.arm64_digest}",
            tmp / "runs-pipeline",
            keypair,
            cache,
            str(other_pipeline),
        )
        yield World(good, mixed), runs
    finally:
        registry.stop()


def _index(
    ref: str, key: Path, out: Path, *runs: Path, attach: bool = False
) -> tuple[int, dict[str, Any], str]:
    extra = ("--attach",) if attach else ()
    r = imagegate(
        "index", ref, *map(str, runs), "--key", f"{key}.key", "-o", str(out), "--format", "json", *extra
    )
    statement: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, statement, r.stderr


def _signed(out: Path, name: str) -> dict[str, Any]:
    """A statement the index attempt signed (its DSSE file's payload)."""
    import base64

    (path,) = out.glob(f"index-sha256-*/*/{name}")
    payload: dict[str, Any] = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    return payload


def _admitted(ref: str, key: Path, work: Path, *, gpu: bool) -> bool:
    """Whether the shipped policies admit a Pod running `ref` (a tag: a controller resolves it
    to the index digest and reads the VSAs attached there). Kyverno and policy-controller must
    agree."""
    found = several.statements_for(ref, keys.load_public_key(Path(f"{key}.pub")))
    now = dt.datetime.now(dt.timezone.utc)
    by_kyverno = not several.kyverno(pod(gpu=gpu), found, now)
    by_policy_controller, _ = several.policy_controller(pod(gpu=gpu), found, not_before(now), work)
    assert by_kyverno == by_policy_controller, (by_kyverno, by_policy_controller)
    return by_kyverno


def test_one_platform_run_is_not_pass_and_names_the_other(
    world: tuple[World, dict[str, Path]], keypair: Path, tmp_path: Path
) -> None:
    w, runs = world
    code, statement, err = _index(w.good.ref, keypair, tmp_path, runs["amd64"], attach=True)
    # deferred, and no level reached (a platform never ran): rejected, as its VSA is
    assert code == 1 and "reaches no level (not run: linux/arm64/v8)" in err, err
    pred = statement["predicate"]
    assert statement["predicateType"] == INDEX_TYPE
    assert statement["subject"] == [{"name": w.good.repository, "digest": {"sha256": w.good.digest[7:]}}]
    assert pred["verdict"] == "CPU_PASS_PLATFORM_LINUX_ARM64_V8_DEFERRED"
    assert pred["notRun"] == ["linux/arm64/v8"]
    assert [p["platform"] for p in pred["platforms"]] == ["linux/amd64", "linux/arm64/v8"]
    assert pred["ignoredManifests"][0]["digest"] == w.good.attestation
    vsa = _signed(tmp_path, "vsa.dsse.json")
    assert vsa["subject"] == statement["subject"]
    assert vsa["predicate"]["verifiedLevels"] == ["FAILED"]
    assert vsa["predicate"]["verificationResult"] == "FAILED"
    # admission resolves the tag to the index: a platform that never ran is not admitted
    assert not _admitted(w.good.ref, keypair, tmp_path / "pc", gpu=False)
    strict = imagegate("index", w.good.ref, str(runs["amd64"]), "--key", f"{keypair}.key", "-o", str(tmp_path / "s"), "--require-complete")  # fmt: skip
    assert strict.returncode == 1, strict.stdout + strict.stderr


def test_both_platforms_run_pass_and_replace_the_partial_statement(
    world: tuple[World, dict[str, Path]], keypair: Path, tmp_path: Path
) -> None:
    w, runs = world
    code, _, err = _index(w.good.ref, keypair, tmp_path / "one", runs["amd64"], attach=True)
    assert code == 1, err  # attached all the same: a deferred index reaching no level
    code, statement, err = _index(
        w.good.ref, keypair, tmp_path / "both", runs["arm64"], runs["amd64"], attach=True
    )
    assert code == 0, err
    pred = statement["predicate"]
    # the attestation manifest is no platform: both images ran, so PASS
    assert pred["verdict"] == "PASS", pred
    assert pred["notRun"] == [] and pred["levels"] == ["IMAGEGATE_CPU"]
    vsa = _signed(tmp_path / "both", "vsa.dsse.json")["predicate"]
    assert vsa["verifiedLevels"] == ["IMAGEGATE_CPU"]
    # as of the older run: a freshness rule never reads an old platform run as new
    assert vsa["timeVerified"] == min(p["finishedOn"] for p in pred["platforms"])
    linked = {a["digest"]["sha256"] for a in vsa["inputAttestations"][1:]}
    assert linked == {p["attestation"]["sha256"] for p in pred["platforms"]}
    # what a controller reads for the tag: the PASS replaced the partial one; no GPU level
    assert _admitted(w.good.ref, keypair, tmp_path / "pc-cpu", gpu=False)
    assert not _admitted(w.good.ref, keypair, tmp_path / "pc-gpu", gpu=True)
    found = imagegate("verify", "--image", w.good.ref, "--key", f"{keypair}.pub", "--expect-verdict", "PASS")
    assert found.returncode == 0, found.stdout + found.stderr
    # the index attempt verifies on its own, the platforms' envelopes with it
    (envelope,) = (tmp_path / "both").glob("index-sha256-*/*/attestation.dsse.json")
    ok = imagegate("verify", str(envelope), "--key", f"{keypair}.pub", "--image", w.good.ref)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_one_platform_failing_fails_the_index(
    world: tuple[World, dict[str, Path]], keypair: Path, tmp_path: Path
) -> None:
    w, runs = world
    code, statement, err = _index(w.mixed.ref, keypair, tmp_path, runs["amd64"], runs["arm64-fail"])
    assert code == 1, err
    assert statement["predicate"]["verdict"] == "FAIL"
    assert _signed(tmp_path, "vsa.dsse.json")["predicate"]["verifiedLevels"] == ["FAILED"]
    # nothing attached to this index: verify names its platform images (not the attestation
    # manifest) and the command that makes the index's own statement
    by_tag = imagegate("verify", "--image", w.mixed.ref, "--key", f"{keypair}.pub")
    assert by_tag.returncode == 1, by_tag.stdout + by_tag.stderr
    assert f"linux/arm64/v8 {w.mixed.arm64}" in by_tag.stdout and w.mixed.attestation not in by_tag.stdout
    assert f"imagegate index {w.mixed.ref} RUN..." in by_tag.stdout, by_tag.stdout
    # attached by hand, the VSA and test-result beside it go too; verify then judges the FAIL
    (envelope,) = tmp_path.glob("index-sha256-*/*/attestation.dsse.json")
    attached = imagegate("attach", str(envelope), w.mixed.ref, "--key", f"{keypair}.pub")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert attached.stdout.count("attached to") == 3, attached.stdout
    judged = imagegate("verify", "--image", w.mixed.ref, "--key", f"{keypair}.pub")
    assert judged.returncode == 1 and "verdict FAIL is not accepted" in judged.stdout, judged.stdout


def _refused(ref: str, key: Path, out: Path, *runs: Path, code: int, says: str) -> None:
    """`imagegate index` refuses these runs with `code`, its message saying `says`, and signs
    nothing."""
    got, _, err = _index(ref, key, out, *runs)
    assert got == code and says in err, err
    assert not list(out.glob("index-*/*/attestation.dsse.json"))


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (("amd64", "other"), "which 127.0.0.1"),  # an image of another repository
        (("arm64-fail",), "does not list: it lists linux/amd64"),  # another index's arm64 manifest
        (("amd64", "arm64-other-pipeline"), "the runs used different pipelines"),
    ],
)
def test_a_run_of_another_image_or_pipeline_is_refused(
    world: tuple[World, dict[str, Path]], keypair: Path, tmp_path: Path, names: tuple[str, ...], says: str
) -> None:
    w, runs = world
    _refused(w.good.ref, keypair, tmp_path, *(runs[n] for n in names), code=3, says=says)


def test_a_run_that_does_not_verify_is_refused(world: tuple[World, dict[str, Path]], tmp_path: Path) -> None:
    """Signed by a key the command does not trust: exit 1."""
    w, runs = world
    other = tmp_path / "other"
    assert imagegate("keygen", "--out", str(other)).returncode == 0
    says = "does not verify, so it is not combined into the index statement"
    _refused(w.good.ref, other, tmp_path / "out", runs["amd64"], code=1, says=says)


def test_run_all_platforms_runs_what_this_host_runs_and_names_the_rest(
    world: tuple[World, dict[str, Path]], keypair: Path, tmp_path: Path
) -> None:
    """On this amd64 host: the amd64 manifest runs (by digest), the arm64 one is named, not run."""
    w, _ = world
    env = {"DOCKER_HOST": "unix:///nonexistent", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = imagegate(
        "run", f"docker://{w.good.ref}", "--all-platforms", "-p", "python", "--driver", "rootfs",
        "-o", str(tmp_path), "--key", f"{keypair}.key", "--format", "json", env=env,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr  # arm64 not run: the index reaches no level
    pred = json.loads(r.stdout)["predicate"]
    assert pred["verdict"] == "CPU_PASS_PLATFORM_LINUX_ARM64_V8_DEFERRED"
    amd64, arm64 = pred["platforms"]
    assert (amd64["manifestDigest"], amd64["verdict"]) == (w.good.amd64, "PASS")
    assert arm64 == {"platform": "linux/arm64/v8", "manifestDigest": w.good.arm64, "ran": False}
    (run_envelope,) = tmp_path.glob("sha256-*/*/attestation.dsse.json")  # the amd64 run, signed
    ok = imagegate(
        "verify",
        str(run_envelope),
        "--key",
        f"{keypair}.pub",
        "--image",
        f"{w.good.repository}@{w.good.amd64}",
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = imagegate(
        "run", "imagegate-test/python:latest", "--all-platforms", "-p", "python", "-o", str(tmp_path / "x")
    )
    assert bad.returncode == 3 and "is not an image in a registry" in bad.stderr, bad.stderr
