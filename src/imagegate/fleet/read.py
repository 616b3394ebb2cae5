"""What the fleet commands read: the cluster's listings (which GPU nodes to check, and the node
check Job each gets), and NODE=ATTEMPT pairs (each node's check from its signed attempt, bound to
that node); and what a run of the Jobs left, as the nodes the fleet is judged on."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate.errors import UsageError
from imagegate.fleet import judge, node_statement

if TYPE_CHECKING:
    from imagegate.attest import keys
    from imagegate.attest.keyless import Expected
    from imagegate.domain.results import StageResult
    from imagegate.fleet.jobs import NodeJob, NodeRun


def node(name: str, stage: StageResult, evidence: str, refused: Sequence[str]) -> judge.Node:
    """A node as the fleet judges it, from its node check stage."""
    data = stage.data
    return judge.Node(
        name, stage.status.value, judge.gpu_model(data), judge.figures_of(data), stage.detail,
        gpus=tuple(node_statement.gpu_uuids(data)), evidence=evidence, refused=tuple(refused),
    )  # fmt: skip


def attempts(given: Sequence[str], key: Path | None, keyless: Expected | None = None) -> list[judge.Node]:
    """Each NODE=ATTEMPT as a judge.Node, from the attempt's signed statement and its node check's
    evidence, with what says the attempt is not that node's own (node_statement.problems). Keyless,
    each attempt is read with the key its own certificate proves was the identity's."""
    from imagegate.attest import keys
    from imagegate.report.load import read_attempt

    public = keys.load_public_key(key) if key else None
    read: list[judge.Node] = []
    seen: set[object] = set()
    for item in given:
        name, attempt = node_attempt(item, seen)
        attempt_key, refused = (public, []) if keyless is None else _certified(attempt, keyless)
        record = read_attempt(attempt, attempt_key).record
        stage = judge.node_check(record)
        if stage is None:
            raise UsageError(f"{item}: this attempt ran no node check", hint="run -p gpu on the node")
        refused += node_statement.problems(name, attempt, record, attempt_key, keyless)
        checked = public is not None or keyless is not None
        evidence = "unverified" if not checked else "refused" if refused else "verified"
        read.append(node(name, stage, evidence, refused))
    return read


def _certified(attempt: Path, keyless: Expected) -> tuple[keys.PublicKey | None, list[str]]:
    """The key the attempt's certificate proves was the identity's, or None and why not."""
    from imagegate.attest.verify import certified_attempt
    from imagegate.errors import NotVerified

    try:
        found = certified_attempt(attempt, keyless, use="so it is no node's check")
    except NotVerified as e:
        return None, [str(e)]
    return found, [] if found is not None else [f"{attempt}: no signed statement: nothing proves who made it"]


def node_attempt(item: str, seen: set[object]) -> tuple[str, Path]:
    """NODE=ATTEMPT as the node's name and its attempt folder, each given once (added to `seen`)."""
    from imagegate.report.load import resolve_attempt

    name, sep, folder = item.partition("=")
    attempt = resolve_attempt(Path(folder)).resolve() if sep and folder else None
    if attempt is None or not name or name in seen or attempt in seen:
        why = "not NODE=ATTEMPT" if attempt is None or not name else "a node or an attempt named twice"
        raise UsageError(
            f"{item!r}: {why}", hint="give each node once, with its own attempt: gpu-1=runs/…/<attempt>"
        )
    seen |= {name, attempt}
    return name, attempt


@dataclass(frozen=True)
class Jobs:
    jobs: list[NodeJob]
    skipped: list[str]  # each GPU node left out, and why


def node_jobs(image: str, nodes: Path, pods: Path | None, namespace: str, kube_version: str) -> Jobs:
    """One node check Job per GPU node of the listings, and the nodes skipped."""
    from imagegate.fleet.jobs import NodeJob
    from imagegate.kube import render as kube_render
    from imagegate.usecases import runner

    found, skipped = judge.targets(listing(nodes, "nodes"), listing(pods, "pods") if pods else None)
    if not found:
        raise UsageError(
            f"{nodes}: no GPU node to check", hint="list the cluster's nodes: kubectl get nodes -o json"
        )
    preps: dict[int, runner.Prepared] = {}
    jobs = []
    for t in found:
        if t.gpus not in preps:  # one plan and bundle per GPU count, not per node
            preps[t.gpus] = runner.prepare(runner.RunOptions(pipeline="gpu", gpus=str(t.gpus)))
        prep = preps[t.gpus]
        name = f"imagegate-node-check-{t.node}".lower()
        if len(name) > 52 or not all(c.isalnum() or c == "-" for c in name):
            name = f"imagegate-node-check-{hashlib.sha256(t.node.encode()).hexdigest()[:12]}"
        rendered = kube_render.render_checked(
            prep, image, kube_version, namespace=namespace, name=name, gpus=t.gpus,
            node_selector=[f"kubernetes.io/hostname={t.node}"],
            toleration=["node.kubernetes.io/unschedulable:NoSchedule"],
        )  # fmt: skip
        jobs.append(NodeJob(t.node, prep, rendered))
    return Jobs(jobs, list(skipped))


def listing(path: Path, what: str) -> dict[str, object]:
    """A Kubernetes list as kubectl prints it, bounded before it is read (untrusted input)."""
    from imagegate._support.files import read_named
    from imagegate.oci import untrusted_json

    try:  # a big cluster's pods: 64 MiB, bounded before it is read, like every file named here
        doc = untrusted_json.loads(read_named(path, what=what, max_bytes=64 << 20), max_bytes=64 << 20)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"{path}: {e}", hint=f"write it with: kubectl get {what} -o json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise UsageError(
            f"{path}: not a Kubernetes list ({what})", hint=f"write it with: kubectl get {what} -o json"
        )
    return doc


@dataclass(frozen=True)
class Judged:
    fleet: judge.Fleet
    no_result: list[str]  # nodes whose Job gave no node check at all


def runs(done: Sequence[NodeRun], key: keys.SigningKey | None) -> Judged:
    """The nodes of a run of the Jobs, each node's statement signed beside its attempt (with a
    key), judged as a fleet."""
    nodes, no_result = [], []
    for r in done:
        stage = judge.node_check(r.record) if r.record else None
        if r.record is None or stage is None:
            no_result.append(r.node)
            nodes.append(judge.Node(r.node, "ERROR", "unknown", {}, r.error or "no node check ran"))
            continue
        nodes.append(node(r.node, stage, "this run", node_statement.ran_elsewhere(r.node, r.record)))
        if key is not None:
            node_statement.sign_attempt(r.node, r.record, key)
    return Judged(judge.judge(nodes), no_result)
