"""Admission end to end through a real API server (tests/kube/apiserver.py, with its controllers)
calling policy-controller's real webhook through its Service (tests/kube/policy_controller.py):
the shipped ClusterImagePolicy as `imagegate policies write` renders it, applied with `kubectl
apply` as a user applies it; then Pods, Deployments, Jobs, StatefulSets and CronJobs created with
`kubectl apply`, in a namespace opted in to the webhook, of images in a registry on 127.0.0.1 that
carry VSAs the real runner signed and `imagegate attach` attached. Every answer is compared with
what policy-controller's tester (`tester --policy --image --resource`, scripts/consumers.py)
answers for the same policy file, image and object, and with what the docs say (scripts/consumers.py
CASES). What only a cluster shows is asserted too: the refusal the user reads, the tag its
mutating webhook pins to its digest, a workload judged as it is created, the Job controller's Pod
admitted through the same webhook.

The webhook and the tester agree on every case: policy-controller's webhook keeps no result cache
(pkg/webhook/cache.go: without one in its context, NoCache; cmd/webhook/main.go puts none there,
v0.13.1), so a FAIL that replaced a PASS, or a moved tag, is read again on every admission. The
one stand-in is sequences.py's (a `--here` verdict re-addressed to the image)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.attest.conftest import push_one_file_image, start_registry
from tests.helpers import load_script
from tests.kube.apiserver import ROOT, started
from tests.kube.policy_controller import PolicyController
from tests.kube.policy_controller import started as policy_controller_started
from tests.kube.workloads import (
    Scene,
    carrying_verdicts,
    copied_onto,
    digest_of,
    has_default_account,
    images,
    made_its_pod,
    named,
    nvidia_runtime_class,
    pod,
    pushed,
    restarting_never,
    written_policy,
)
from tests.oci.infra import wait_for
from tests.policies.admission import templated
from tests.policies.conftest import make_keys, make_runs
from tests.policies.sequences import addressed, attach_as

POLICY = "imagegate-accepted"  # the shipped ClusterImagePolicy's name
WEBHOOK = "policy.sigstore.dev"  # the name its refusals come under (config/500-webhook-configuration.yaml)


@dataclass
class Cluster(Scene):
    pc: PolicyController = field(kw_only=True)  # its namespace is opted in to the webhook


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    consumers = load_script(ROOT / "scripts" / "consumers.py")
    keys = make_keys(tmp_path_factory.mktemp("pc-keys"))
    runs = make_runs(tmp_path_factory.mktemp("pc-runs"), keys)
    with (
        start_registry(tmp_path_factory.mktemp("pc-registry")) as registry,
        started(tmp_path_factory.mktemp("control-plane"), controllers=True, aggregator_routing=True) as api,
        policy_controller_started(
            api, tmp_path_factory.mktemp("policy-controller"), int(registry.rpartition(":")[2])
        ) as pc,
    ):
        nvidia_runtime_class(api)
        work = tmp_path_factory.mktemp("pc-work")
        policy = written_policy("policy-controller-clusterimagepolicy", keys, registry, work)
        ns = pc.namespace_for_it("privileged")
        assert wait_for(lambda: has_default_account(api, ns), timeout=60)
        stored = pc.apply_policy(policy, ns)
        assert [a["name"] for a in stored["spec"]["authorities"]] == ["imagegate-cpu", "imagegate-gpu"]
        yield Cluster(api, registry, keys, runs, policy, consumers, work, ns, pc=pc)


def _attach(c: Cluster, run: str, ref: str, days_old: int = 0) -> None:
    """`imagegate attach` of the run's statement, re-addressed to `ref` (the stand-in); said
    `days_old` days ago where given."""
    finished = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days_old) if days_old else None
    made = addressed(c.runs[run], ref, c.fresh(f"{run}-statement") / "s", c.keys.key, finished)
    attach_as("replace", made, ref)


@dataclass(frozen=True)
class Judged:
    admitted: bool
    said: str
    seconds: float
    cli: bool | None  # the tester on the same policy file and object, every image of it
    cli_said: str
    stored: dict[str, Any] | None  # the object as the API server stored it, when admitted


def _pinned(image: str) -> str:
    """`image` as policy-controller's mutating webhook leaves it: a tag kept, its digest appended
    (resolvePodSpec in pkg/webhook/validator.go); a digest as it is."""
    return image if "@" in image else f"{image}@{digest_of(image).partition('@')[2]}"


def judge(c: Cluster, obj: dict[str, Any]) -> Judged:
    """`kubectl apply` of `obj` through the API server and policy-controller's webhooks, and its
    tester on the same policy file and object for each image of it, pinned to its digest as the
    webhook pins it (the tester judges one image; the object is admitted when every image is).
    A refusal must be the webhook's denial: a broken call is no answer."""
    obj, d, got = c.apply(obj)
    if not got.admitted:
        assert f'admission webhook "{WEBHOOK}" denied the request' in got.said, f"{got.said}\n{c.pc.log()}"
    answers = [
        c.consumers.policy_controller_test(c.policy, _pinned(i), d / "object.yaml") for i in images(obj)
    ]
    cli = None if any(a.admitted is None for a in answers) else all(a.admitted for a in answers)
    print(
        f"  {obj['kind']} {images(obj)}: API server {'admitted' if got.admitted else 'refused'} in {got.seconds:.2f} s; "
        f"tester {cli}",
        flush=True,
    )
    return Judged(got.admitted, got.said, got.seconds, cli, " | ".join(a.said for a in answers), got.stored)


@pytest.fixture(scope="module")
def verdicts(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """verdict -> (tag, repo@digest) of an image carrying it; `none` carries nothing."""
    return carrying_verdicts(cluster.registry, lambda run, ref: _attach(cluster, run, ref))


def test_an_accepted_image_is_admitted_and_a_refused_or_unjudged_one_never(
    cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    accepted = judge(cluster, pod(verdicts["PASS"][1]))
    assert accepted.admitted and accepted.cli is True, (accepted.said, accepted.cli_said)
    for verdict in ("FAIL", "none"):
        refused = judge(cluster, pod(verdicts[verdict][1]))
        assert not refused.admitted and refused.cli is False, (verdict, refused.cli_said)
        # what the user reads names the policy, the field and the image refused
        assert f"failed policy: {POLICY}: spec.containers[0].image" in refused.said, refused.said
        assert verdicts[verdict][1] in refused.said, refused.said


def test_a_tag_is_admitted_pinned_to_the_digest_it_was_judged_by(
    cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    tag, ref = verdicts["PASS"]
    admitted = judge(cluster, pod(tag))
    assert admitted.admitted and admitted.cli is True, (admitted.said, admitted.cli_said)
    assert admitted.stored is not None
    (image,) = [c["image"] for c in admitted.stored["spec"]["containers"]]
    # its mutating webhook: the Pod stored runs the digest whose VSA was verified, whatever the
    # tag names later, and keeps the tag for the reader
    assert image == f"{tag}@{ref.partition('@')[2]}", image
    refused = judge(cluster, pod(verdicts["FAIL"][0]))
    assert not refused.admitted and refused.cli is False, refused.cli_said


# Where its validator reports a workload's containers (pkg/webhook/validator.go: ViaField).
FIELD = {
    "Deployment": "spec.template.spec",
    "Job": "spec.template.spec",
    "StatefulSet": "spec.template.spec",
    "CronJob": "spec.jobTemplate.spec.template.spec",
}


@pytest.mark.parametrize("kind", ["Deployment", "Job", "StatefulSet", "CronJob"])
def test_a_workload_is_judged_when_it_is_created(
    kind: str, cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    shaped = restarting_never if kind in ("Job", "CronJob") else (lambda p: p)
    refused = judge(cluster, templated(kind, shaped(pod(verdicts["FAIL"][0]))))
    assert not refused.admitted and refused.cli is False, (refused.said, refused.cli_said)
    # the workload itself is refused as it is created, its Pod template's container named
    assert f"failed policy: {POLICY}: {FIELD[kind]}.containers[0].image" in refused.said, refused.said
    tag, ref = verdicts["PASS"]
    admitted = judge(cluster, templated(kind, shaped(pod(tag))))
    assert admitted.admitted and admitted.cli is True, (admitted.said, admitted.cli_said)
    assert admitted.stored is not None
    spec = admitted.stored["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if kind == "CronJob" else spec["template"]
    (image,) = [c["image"] for c in template["spec"]["containers"]]
    assert image == f"{tag}@{ref.partition('@')[2]}", image  # the template pinned too
    if kind == "Job":  # the Job controller's Pod goes through the same webhook, and is admitted
        made_its_pod(cluster.api, cluster.namespace, admitted.stored["metadata"]["name"])


def sequence(c: Cluster, case: str, kind: str = "Pod") -> dict[tuple[str, int], str]:
    """scripts/consumers.py's CASES[case] as imagegate attaches (replacing): each Pod of a step,
    or a `kind` whose template it is, through the API server and the tester; every step where
    either differs from the docs."""
    name = "seq/" + re.sub(r"[^a-z0-9]+", "-", f"{case} {kind}".lower()).strip("-")
    _, ref = pushed(c.registry, name, f"{case} {kind}\n".encode())
    wrong = {}
    for n, step in enumerate(c.consumers.CASES[case]):
        if step.kind == "attach":
            _attach(c, step.arg, ref, step.days_old)
            continue
        docs = step.expect["replace"][1]  # (Kyverno, policy-controller)
        obj = c.consumers.pod_of(step.arg, ref)
        if kind != "Pod":
            obj = templated(kind, restarting_never(obj) if kind in ("Job", "CronJob") else obj)
        got = judge(c, obj)
        if got.admitted != docs or got.cli != docs:
            wrong[(case, n)] = f"{step.arg}: API server {got.admitted}, tester {got.cli}, docs {docs}"
    return wrong


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "Job", "StatefulSet", "CronJob"])
@pytest.mark.parametrize(
    "case", ["FAIL then PASS", "PASS then FAIL", "deferred then completed", "8 days old then fresh"]
)
def test_a_verdict_sequence_is_judged_as_the_docs_say_and_as_the_tester_judges_it(
    case: str, kind: str, cluster: Cluster
) -> None:
    """Every sequence, each of its Pods (every GPU route) created as a Pod and as each workload
    kind the policy's match covers."""
    assert sequence(cluster, case, kind) == {}


def test_a_moved_tag_is_verified_again_and_refused(cluster: Cluster) -> None:
    """A tag whose image has a PASS, admitted pinned; then moved to an image nobody judged: a Pod
    by that tag is pinned to the new digest and refused (no cache: its VSAs are read again)."""
    tag, ref = pushed(cluster.registry, "moved", b"accepted\n")
    _attach(cluster, "pass", ref)
    assert judge(cluster, pod(tag)).admitted
    push_one_file_image(tag, b"never judged\n")
    other = digest_of(tag)
    assert other != ref
    got = judge(cluster, pod(tag))
    assert not got.admitted and got.cli is False, got.said
    assert other.partition("@")[2] in got.said, got.said  # the refusal names the digest it resolved


def test_a_namespace_not_opted_in_is_never_judged(
    cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    """Its webhooks are called only for namespaces labelled policy.sigstore.dev/include=true (the
    namespaceSelector of config/500-webhook-configuration.yaml, which its reconciler keeps, adding
    only knative's own exclusion: webhook/resourcesemantics/validation/reconcile_config.go and
    defaulting/defaulting.go of knative.dev/pkg v0.0.0-20230612155445-74c4be5e935e): elsewhere a FAIL image is admitted, and kept as written,
    no tag pinned. The tester knows no namespace: the one place they differ, by the install's
    design."""
    other = cluster.api.namespace("privileged")
    assert wait_for(lambda: has_default_account(cluster.api, other), timeout=60)
    tag = verdicts["FAIL"][0]
    unjudged = named(pod(tag), "unjudged", other)
    applied = cluster.api.kubectl_run("apply", "-f", "-", stdin=json.dumps(unjudged))
    assert applied.returncode == 0, applied.stderr
    got = cluster.api.kubectl_run("get", "pod", "unjudged", "-n", other, "-o", "json")
    assert json.loads(got.stdout)["spec"]["containers"][0]["image"] == tag


def test_another_images_statement_never_admits(cluster: Cluster) -> None:
    _, a = pushed(cluster.registry, "one", b"image A\n")
    _, b = pushed(cluster.registry, "other", b"image B: another digest\n")
    _attach(cluster, "pass", a)
    assert judge(cluster, pod(a)).admitted
    assert not judge(cluster, pod(b)).admitted
    # Even copied onto B's `.att` tag by hand (attach refuses it), A's VSA names A's digest.
    made = addressed(cluster.runs["pass"], a, cluster.fresh("copied") / "s", cluster.keys.key)
    copied_onto(made, b)
    copied = judge(cluster, pod(b))
    assert not copied.admitted and copied.cli is False, copied.cli_said
