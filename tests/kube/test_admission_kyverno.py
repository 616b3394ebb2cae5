"""Admission end to end through a real API server (tests/kube/apiserver.py, with its controllers)
calling Kyverno's real admission controller as its webhook (tests/kube/kyverno.py): the shipped
ClusterPolicy as `imagegate policies write` renders it, applied with `kubectl apply` as a user
applies it; then Pods, Deployments and Jobs created with `kubectl apply` of images in a registry
on 127.0.0.1 that carry VSAs the real runner signed and `imagegate attach` attached. Every answer
is compared with what Kyverno's CLI (`kubectl-kyverno apply --registry`, scripts/consumers.py)
answers for the same policy file and object, and with what the docs say (scripts/consumers.py
CASES). What only a cluster shows is asserted too: the refusal the user reads, the tag the webhook
pins to its digest, Kyverno's autogen judging a Deployment, Job, StatefulSet or CronJob itself
when it is created, the Job controller's Pod admitted through the same webhook.

The webhook and the CLI agree on every case. They would not with Kyverno's image verify cache on,
which the CLI does not have: it keeps admitting an image whose PASS was replaced by a FAIL, and
admits a moved tag pinned to a digest nobody verified; so the shipped policy sets `useCache:
false`, and a test turns the cache back on to show both. The one stand-in is sequences.py's (a
`--here` verdict re-addressed to the image)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.attest.conftest import push_one_file_image, start_registry
from tests.helpers import load_script
from tests.kube.apiserver import ROOT, started
from tests.kube.kyverno import Kyverno
from tests.kube.kyverno import started as kyverno_started
from tests.kube.workloads import (
    Scene,
    carrying_verdicts,
    copied_onto,
    digest_of,
    has_default_account,
    images,
    made_its_pod,
    nvidia_runtime_class,
    pod,
    pushed,
    restarting_never,
    written_policy,
)
from tests.oci.infra import wait_for
from tests.policies.admission import CPU_RULE, templated
from tests.policies.conftest import make_keys, make_runs
from tests.policies.sequences import addressed, attach_as

POLICY = "imagegate-accepted"  # the shipped ClusterPolicy's name


@dataclass
class Cluster(Scene):
    kyverno: Kyverno = field(kw_only=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    consumers = load_script(ROOT / "scripts" / "consumers.py")
    keys = make_keys(tmp_path_factory.mktemp("kyverno-keys"))
    runs = make_runs(tmp_path_factory.mktemp("kyverno-runs"), keys)
    with (
        start_registry(tmp_path_factory.mktemp("kyverno-registry")) as registry,
        started(tmp_path_factory.mktemp("control-plane"), controllers=True) as api,
        kyverno_started(api, tmp_path_factory.mktemp("kyverno")) as kyverno,
    ):
        nvidia_runtime_class(api)
        policy = written_policy(
            "kyverno-clusterpolicy", keys, registry, tmp_path_factory.mktemp("kyverno-work")
        )
        stored = kyverno.apply_policy(policy)
        assert stored["spec"]["rules"], stored
        ns = api.namespace("privileged")
        assert wait_for(lambda: has_default_account(api, ns), timeout=60)
        yield Cluster(api, registry, keys, runs, policy, consumers, policy.parent, ns, kyverno=kyverno)


def _attach(c: Cluster, run: str, ref: str, days_old: int = 0) -> None:
    """`imagegate attach` of the run's statement, re-addressed to `ref` (the stand-in), said
    `days_old` days ago when given."""
    said = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days_old) if days_old else None
    made = addressed(c.runs[run], ref, c.fresh(f"{run}-statement") / "s", c.keys.key, said)
    attach_as("replace", made, ref)


@dataclass(frozen=True)
class Judged:
    admitted: bool
    said: str
    seconds: float
    cli: bool | None  # Kyverno's CLI on the same policy file and object
    cli_said: str
    stored: dict[str, Any] | None  # the object as the API server stored it, when admitted


def judge(c: Cluster, obj: dict[str, Any]) -> Judged:
    """`kubectl apply` of `obj` through the API server and Kyverno's webhooks, and Kyverno's CLI
    on the same object and the policy file as written (the CLI keeps no cache: `useCache`
    changes nothing there). A refusal must be a webhook's denial: a broken call is no answer."""
    obj, d, got = c.apply(obj)
    if not got.admitted:
        assert "denied the request" in got.said, f"{got.said}\n{c.kyverno.log()}"
    cli = c.consumers.kyverno_apply(c.policy, d / "object.yaml")
    print(
        f"  {obj['kind']} {images(obj)}: API server {'admitted' if got.admitted else 'refused'} in {got.seconds:.2f} s; "
        f"CLI {cli.admitted}",
        flush=True,
    )
    return Judged(got.admitted, got.said, got.seconds, cli.admitted, cli.said, got.stored)


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
        # what the user reads names the policy and the rule that refused
        assert f"resource Pod/{cluster.namespace}/" in refused.said, refused.said
        assert POLICY in refused.said and CPU_RULE in refused.said, refused.said


def test_a_tag_is_admitted_pinned_to_the_digest_it_was_judged_by(
    cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    tag, ref = verdicts["PASS"]
    admitted = judge(cluster, pod(tag))
    assert admitted.admitted and admitted.cli is True, (admitted.said, admitted.cli_said)
    assert admitted.stored is not None
    (image,) = [c["image"] for c in admitted.stored["spec"]["containers"]]
    # Kyverno's mutateDigest: the Pod stored runs the digest whose VSA was verified, whatever
    # the tag names later
    assert image.endswith("@" + ref.partition("@")[2]), image
    refused = judge(cluster, pod(verdicts["FAIL"][0]))
    assert not refused.admitted and refused.cli is False, refused.cli_said


@pytest.mark.parametrize("kind", ["Deployment", "Job", "StatefulSet", "CronJob"])
def test_a_workload_is_judged_when_it_is_created_by_kyvernos_autogen(
    kind: str, cluster: Cluster, verdicts: dict[str, tuple[str, str]]
) -> None:
    shaped = restarting_never if kind in ("Job", "CronJob") else (lambda p: p)
    refused = judge(cluster, templated(kind, shaped(pod(verdicts["FAIL"][0]))))
    assert not refused.admitted and refused.cli is False, (refused.said, refused.cli_said)
    # the workload itself is refused as it is created, by the rule autogen wrote for its kind
    assert f"resource {kind}/{cluster.namespace}/" in refused.said, refused.said
    rule = f"autogen-{'cronjob-' if kind == 'CronJob' else ''}{CPU_RULE}"
    assert rule in refused.said, refused.said
    tag, ref = verdicts["PASS"]
    admitted = judge(cluster, templated(kind, shaped(pod(tag))))
    assert admitted.admitted and admitted.cli is True, (admitted.said, admitted.cli_said)
    assert admitted.stored is not None
    spec = admitted.stored["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if kind == "CronJob" else spec["template"]
    (image,) = [c["image"] for c in template["spec"]["containers"]]
    assert image.endswith("@" + ref.partition("@")[2]), image  # the template pinned too
    if kind == "Job":  # the Job controller's Pod goes through the same webhook, and is admitted
        made_its_pod(cluster.api, cluster.namespace, admitted.stored["metadata"]["name"])


# Kyverno's image verify cache (github.com/kyverno/kyverno v1.19.1; on unless
# --imageVerifyCacheEnabled=false or a verifyImages entry's useCache is false, an hour's TTL:
# cmd/internal/flag.go) keeps every image it verified admitted under the same policy version and
# rule: on a hit, pkg/engine/internal/imageverifier.go passes the rule without reading the
# attestations, and pkg/image/verification/cache/client.go keys it on policy UID,
# resourceVersion, rule and the image as the Pod writes it. The CLI has no cache. The shipped
# policy turns it off; with it on, the webhook disagrees here (asserted, so that a Kyverno
# release that changes it is noticed).
CACHED = "admitted from Kyverno's image verify cache: the FAIL that replaced the PASS is not read"
WITH_THE_CACHE = {("PASS then FAIL", 3): CACHED}


def sequence(c: Cluster, case: str, kind: str = "Pod") -> dict[tuple[str, int], str]:
    """scripts/consumers.py's CASES[case] as imagegate attaches (replacing): each Pod of a step,
    or a `kind` whose template it is, through the API server and the CLI; every step where either
    differs from the docs."""
    name = f"seq/{case.replace(' ', '-')}-{kind}".lower()
    _, ref = pushed(c.registry, name, f"{case} {kind}\n".encode())
    wrong = {}
    for n, step in enumerate(c.consumers.CASES[case]):
        if step.kind == "attach":
            _attach(c, step.arg, ref, step.days_old)
            continue
        docs = step.expect["replace"][0]  # (Kyverno, policy-controller)
        obj = c.consumers.pod_of(step.arg, ref)
        if kind != "Pod":
            obj = templated(kind, restarting_never(obj) if kind in ("Job", "CronJob") else obj)
        got = judge(c, obj)
        if got.admitted != docs or got.cli != docs:
            wrong[(case, n)] = f"{step.arg}: API server {got.admitted}, CLI {got.cli}, docs {docs}"
            if got.cli == docs and got.admitted and _from_cache(c, ref):
                wrong[(case, n)] = CACHED
    return wrong


def _from_cache(c: Cluster, ref: str) -> bool:
    """Whether Kyverno's log (the chart's -v=2) says it found `ref` in its image verify cache."""
    name, _, digest = ref.partition("@")
    repo = name.rsplit(":", 1)[0]  # Kyverno logs the image as repo@digest, without the tag
    return any(
        "cache entry found" in line and repo in line and digest in line
        for line in c.kyverno.log(10**7).splitlines()
    )


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "Job", "StatefulSet", "CronJob"])
@pytest.mark.parametrize(
    "case", ["FAIL then PASS", "PASS then FAIL", "deferred then completed", "8 days old then fresh"]
)
def test_a_verdict_sequence_is_judged_as_the_docs_say_and_as_the_cli_judges_it(
    case: str, kind: str, cluster: Cluster
) -> None:
    """Every sequence, each of its Pods (every GPU route: limits, an init container, a MIG slice,
    a runtime class) created as a Pod and as each workload kind Kyverno's autogen covers."""
    assert sequence(cluster, case, kind) == {}


def _moved(cluster: Cluster, name: str) -> tuple[Judged, str]:
    """A tag whose image has a PASS, admitted; then moved to an image nobody judged: the answer
    for a Pod by that tag, and the digest it names now."""
    tag, ref = pushed(cluster.registry, name, b"accepted\n")
    _attach(cluster, "pass", ref)
    assert judge(cluster, pod(tag)).admitted
    other = digest_of(push_one_file_image(tag, b"never judged\n")).partition("@")[2]
    return judge(cluster, pod(tag)), other


def test_a_moved_tag_is_verified_again_and_refused(cluster: Cluster) -> None:
    got, _ = _moved(cluster, "moved")
    assert not got.admitted and got.cli is False, got.said


def test_with_kyvernos_cache_on_the_webhook_admits_what_the_cli_refuses(cluster: Cluster) -> None:
    """Why the shipped policy sets `useCache: false` (Kyverno's ImageVerification.UseCache,
    api/kyverno/v1/image_verification_types.go): with the cache on, the FAIL that replaced a PASS
    is not read, and a moved tag is admitted from the cache pinned to whatever digest it names now
    (handleMutateDigest in pkg/engine/internal/imageverifier.go, v1.19.1; GHSA-2r43-6962-xcw5,
    whose fix, kyverno pull request 16213, is not in v1.19.1). The CLI verifies, and refuses. The
    shipped policy is put back afterwards."""
    policy = yaml.safe_load(cluster.policy.read_text())
    for rule in policy["spec"]["rules"]:
        for entry in rule["verifyImages"]:
            assert entry.pop("useCache") is False  # the shipped policy turns it off
    cached = cluster.work / "cached.yaml"
    cached.write_text(yaml.safe_dump(policy))
    try:
        cluster.kyverno.apply_policy(cached)
        assert sequence(cluster, "PASS then FAIL") == WITH_THE_CACHE
        got, other = _moved(cluster, "moved-cached")
        assert got.cli is False, got.cli_said
        assert got.admitted and got.stored is not None, got.said
        assert got.stored["spec"]["containers"][0]["image"].endswith("@" + other)
    finally:
        cluster.kyverno.apply_policy(cluster.policy)


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
