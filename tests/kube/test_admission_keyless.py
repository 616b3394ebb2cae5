"""Keyless admission end to end: the controllers' real webhooks called by a real API server,
judging Pods of an image whose VSA `run --attach` signed keyless as a GitHub-shaped workflow of
the tests' own Sigstore (tests/attest/sigstore_local.py: Fulcio, a CT log, Rekor v2, a timestamp
authority; the OIDC issuer a STAND-IN, named so), with the policies `imagegate policies write
--identity --issuer --trusted-root` writes, applied with `kubectl apply` as a user applies them:

- policy-controller's webhook (tests/kube/policy_controller.py) through its Service: the
  ClusterImagePolicy and its TrustRoot (reconciled into the webhook's keys), its authorities
  reading the `.att` layers' classic keyless proof (the certificate, a timestamp over the layer);
  policy-controller's tester answers the same for the same files;
- Kyverno's admission controller (tests/kube/kyverno.py) started as an install for a Sigstore of
  one's own starts it (--enableTuf, --tufMirror, --tufRoot: the trusted root published in a TUF
  repository of the test's own, tests/attest/tuf_repo.py), the ClusterPolicy reading the bundle
  referrers.

Each admits the image for the workflow its policy names, refuses it for another workflow's, and
refuses an image nobody attested."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import attach
from tests.attest import tuf_repo
from tests.attest.conftest import cli, start_registry
from tests.attest.sigstore_local import LocalSigstore, local_sigstore
from tests.helpers import go_tools, load_script
from tests.kube.apiserver import ROOT, ApiServer, started
from tests.kube.kyverno import Kyverno
from tests.kube.kyverno import started as kyverno_started
from tests.kube.policy_controller import PolicyController
from tests.kube.policy_controller import started as policy_controller_started
from tests.kube.workloads import has_default_account, pod
from tests.oci.infra import skopeo, wait_for

pytestmark = pytest.mark.engine

REPO = "org/gate"  # the workflow that signs (tests/attest/test_keyless_sigstore.py's)
WEBHOOK = "policy.sigstore.dev"
POLICY = "imagegate-accepted"


@dataclass(frozen=True)
class Attested:
    local: LocalSigstore
    registry: str
    attested: str  # repo@digest of the image whose VSA REPO's workflow attached keyless
    bare: str  # repo@digest of an image nothing is attached to
    work: Path


@dataclass
class Scene:
    api: ApiServer
    pc: PolicyController
    made: Attested
    namespace: str  # opted in to the webhook


def _copied(images: dict[str, str], registry: str, repo: str) -> str:
    """The python test image copied to `repo` (skopeo: the engine never pushes the shared image);
    its repo@digest."""
    ref = f"{registry}/{repo}:1"
    skopeo("copy", "-q", "--dest-tls-verify=false", f"docker-daemon:{images['python']}", f"docker://{ref}")
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return f"{registry}/{repo}@{attach.resolve(client, parsed).digests[0]}"


@pytest.fixture(scope="module")
def made(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attested]:
    """The tests' Sigstore, a registry, and in it an image REPO's workflow attested keyless
    (`run --attach`), beside one nobody attested."""
    work = tmp_path_factory.mktemp("keyless-admission")
    with (
        local_sigstore(go_tools("sigstore", "tesseract")) as local,
        start_registry(tmp_path_factory.mktemp("keyless-registry")) as registry,
    ):
        attested = _copied(images, registry, "keyless-admission/app")
        bare = _copied(images, registry, "keyless-admission/bare")
        env = {"SIGSTORE_ID_TOKEN": local.token(REPO), "XDG_CONFIG_HOME": str(work / "cfg")}
        run = cli(
            "run", attested, "--driver", "rootfs", "-p", "python", "-m", "json", "-o", str(work / "runs"),
            "--key", f"sigstore:{local.client_trust_config}", "--attach", env=env, cwd=work,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        yield Attested(local, registry, attested, bare, work)


@pytest.fixture(scope="module")
def scene(made: Attested, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with (
        started(tmp_path_factory.mktemp("control-plane"), controllers=True, aggregator_routing=True) as api,
        policy_controller_started(
            api, tmp_path_factory.mktemp("policy-controller"), int(made.registry.rpartition(":")[2])
        ) as pc,
    ):
        ns = pc.namespace_for_it("privileged")
        assert wait_for(lambda: has_default_account(api, ns), timeout=60)
        yield Scene(api, pc, made, ns)


def _policies(m: Attested, sub: str) -> Path:
    """`policies write` keyless for `sub`'s workflow: the folder of the files written."""
    out = m.work / sub.replace("/", "-")
    if not out.exists():
        r = cli(
            "policies", "write", "--identity", m.local.identity(sub), "--issuer", m.local.issuer("github"),
            "--trusted-root", str(m.local.trusted_root), "--image", f"{m.registry}/keyless-admission/*",
            "--out", str(out),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    return out


def _written(s: Scene, sub: str) -> tuple[Path, Path]:
    """The ClusterImagePolicy written for `sub`'s workflow, and its TrustRoot split into a file of
    its own (the tester reads one of each)."""
    written = _policies(s.made, sub) / "policy-controller-clusterimagepolicy.yaml"
    split: tuple[Path, Path] = load_script(ROOT / "scripts" / "consumers.py").split_trust_root(written)
    return split


def _pod(image: str) -> dict[str, Any]:
    return {**pod(image), "metadata": {"name": "app"}}  # applied with -n: the namespace kubectl is given


def _admitted(s: Scene, image: str) -> tuple[bool, str]:
    """Whether the API server admits a Pod of `image` (server-side dry run: the webhooks are
    called, nothing is stored), and what it said. A refusal must be the webhook's."""
    said = s.pc.dry_run(_pod(image), s.namespace)
    if "created (server dry run)" in said:
        return True, said
    assert f'admission webhook "{WEBHOOK}" denied the request' in said, f"{said}\n{s.pc.log()}"
    return False, said


def _applied(s: Scene, sub: str) -> tuple[Path, Path]:
    """The policy written for `sub` in force: any earlier one removed first (the webhook no
    longer judging by it), its TrustRoot applied, then the policy, until the webhook judges by it."""
    s.api.kubectl_run("delete", f"clusterimagepolicy/{POLICY}", "--ignore-not-found", "--wait")
    bare = s.made.bare
    assert wait_for(lambda: "no matching policies" in s.pc.dry_run(_pod(bare), s.namespace), timeout=120)
    cip, trust = _written(s, sub)
    applied = s.api.kubectl_run("apply", "-f", str(trust))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    s.pc.apply_policy(cip, s.namespace)
    return cip, trust


@pytest.mark.parametrize("sub", ["org/other", REPO])
def test_the_webhook_admits_for_the_identity_its_policy_names_and_refuses_another(
    scene: Scene, sub: str
) -> None:
    """The policy written for `sub`: REPO's admits the image REPO's workflow attested; another
    workflow's refuses it; an image nothing vouches for is refused either way. The tester agrees
    on the same files."""
    cip, trust = _applied(scene, sub)
    attested = scene.made.attested
    admitted, said = _admitted(scene, attested)
    assert admitted is (sub == REPO), said
    assert _admitted(scene, scene.made.bare)[0] is False
    consumers = load_script(ROOT / "scripts" / "consumers.py")
    resource = scene.made.work / "pod.yaml"
    resource.write_text(json.dumps(_pod(attested)))
    tester = consumers.policy_controller_test(cip, attested, resource, trust)
    assert tester.admitted is admitted, tester.said


@dataclass
class KyvernoScene:
    api: ApiServer
    kyverno: Kyverno
    made: Attested
    namespace: str


@pytest.fixture(scope="module")
def kyverno_scene(made: Attested, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KyvernoScene]:
    """Kyverno's admission controller started for the tests' Sigstore: its trusted root published
    in a TUF repository, which the flags an install sets for a Sigstore of one's own name."""
    tuf = tmp_path_factory.mktemp("tuf")
    (tuf / "root.json").write_bytes(
        tuf_repo.build(tuf / "repo", {"trusted_root.json": made.local.trusted_root.read_bytes()})
    )
    with (
        tuf_repo.served(tuf / "repo") as mirror,
        started(tmp_path_factory.mktemp("control-plane"), controllers=True) as api,
        kyverno_started(
            api,
            tmp_path_factory.mktemp("kyverno"),
            {"enableTuf": "true", "tufMirror": mirror, "tufRoot": str(tuf / "root.json")},
        ) as kyverno,
    ):
        ns = api.namespace("privileged")
        assert wait_for(lambda: has_default_account(api, ns), timeout=60)
        yield KyvernoScene(api, kyverno, made, ns)


def _kyverno_admits(s: KyvernoScene, image: str) -> tuple[bool, str]:
    got = s.api.kubectl_run(
        "apply", "--dry-run=server", "-n", s.namespace, "-f", "-", stdin=json.dumps(_pod(image)), timeout=60
    )
    said = got.stdout + got.stderr
    if got.returncode == 0:
        return True, said
    assert "denied the request" in said, f"{said}\n{s.kyverno.log()}"
    return False, said


@pytest.mark.parametrize("sub", ["org/other", REPO])
def test_kyverno_admits_for_the_identity_its_policy_names_and_refuses_another(
    kyverno_scene: KyvernoScene, sub: str
) -> None:
    """The ClusterPolicy written for `sub`, its only trust the TUF repository Kyverno was started
    with: REPO's admits the image REPO's workflow attested, another workflow's refuses it, and
    an image nothing vouches for is refused either way."""
    s = kyverno_scene
    s.api.kubectl_run("delete", f"clusterpolicy/{POLICY}", "--ignore-not-found", "--wait")
    assert wait_for(lambda: _kyverno_admits(s, s.made.bare)[0], timeout=120)  # no policy: admitted
    s.kyverno.apply_policy(_policies(s.made, sub) / "kyverno-clusterpolicy.yaml")
    assert wait_for(lambda: not _kyverno_admits(s, s.made.bare)[0], timeout=120)  # judged by it now
    admitted, said = _kyverno_admits(s, s.made.attested)
    assert admitted is (sub == REPO), f"{said}\n{s.kyverno.log()}"
