"""Command: fleet report (every node's node check beside its peers). Parse, call imagegate.domain.fleet,
render."""

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer import Argument

from imagegate.cli import _app
from imagegate.cli._app import Format, Option, app
from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `fleet --help` loads none of the layers below
    from imagegate.attest import keys
    from imagegate.domain import fleet
    from imagegate.domain.results import RunRecord, StageResult
    from imagegate.kube import fleetrun
    from imagegate.usecases import accept
    from imagegate.usecases.runner import Notify

fleet_app = typer.Typer(
    help=(
        "A GPU fleet judged as a fleet: each node's node check beside the nodes of its GPU model.\n\n"
        "Examples:\n\n  imagegate fleet report gpu-1=runs/a/… gpu-2=runs/b/… gpu-3=runs/c/… --key ci.pub"
    ),
    no_args_is_help=True,
)
app.add_typer(fleet_app, name="fleet")

_IMAGE = Argument(..., help="The image with the torch to check each node with, by digest.")
_OUT = Option(Path("imagegate-runs"), "--out", "-o", metavar="FOLDER", help=_app.EVIDENCE_HELP)
_NODES = Option(..., "--nodes", metavar="FILE", help="kubectl get nodes -o json.")
_PODS = Option(None, "--pods", metavar="FILE", help="kubectl get pods -A -o json.")


_UNSIGNED = Option(
    False,
    "--unsigned",
    help="Judge attempts no key vouches for (every node unverified); without it or --key: exit 1.",
)


@fleet_app.command(
    "report",
    epilog="Each NODE=ATTEMPT names a node and the attempt of the node check that ran on it (`-p gpu`, "
    "or any pipeline with a node_check stage; an image folder means its latest attempt). A node is "
    "unfit when its check did not pass; suspect when it passed but a figure (BF16 TFLOP/s, held, "
    "HBM, host↔GPU, all-reduce bus bandwidth; a node's is its weakest GPU's) is more than "
    "--suspect-below under the median of the passing nodes of its GPU model, where there are "
    "--min-peers of them (else the node check's own floors alone). Prints the kubectl label and "
    "taint commands for them, never runs them. An attempt is bound to its node: a node whose "
    "attempt ran on another node, whose node statement (node-check.dsse.json, signed by fleet "
    "run and fleet collect) names another node or attempt, or whose GPU UUID another node "
    "names too, is refused: unfit, and never a peer. With --key every attempt must verify with "
    "it (signature, every evidence file) and carry its node statement, verified too, else the "
    "node is refused. Without --key every node is unverified and the report exits 1, unless "
    "--unsigned is given. Exit 0 when every node is fit, 1 when one is suspect, unfit or "
    "refused (or nothing was verified), 3 for unreadable input.\n\nExamples:\n\n"
    "  imagegate fleet report gpu-1=runs/gpu-1/sha256-…/<attempt> gpu-2=runs/gpu-2/sha256-… gpu-3=… --key ci.pub\n\n"
    "  imagegate fleet report gpu-1=… gpu-2=… gpu-3=… --key ci.pub --suspect-below 0.05 --format json",
)
def report(
    nodes: list[str] = Argument(..., metavar="NODE=ATTEMPT...", help="A node's name and its attempt folder."),
    key: Path | None = _app.ATTESTATION_KEY,
    unsigned: bool = _UNSIGNED,
    suspect_below: float = Option(
        0.10,
        "--suspect-below",
        metavar="FRACTION",
        help="How far under its peers' median a figure is suspect.",
    ),
    min_peers: int = Option(
        3, "--min-peers", metavar="N", help="Passing nodes of one GPU model a median needs."
    ),
    fmt: Format = _app.FORMAT,
) -> None:
    """Judge every node's node check beside its peers; say which nodes to label or taint."""
    import sys

    from imagegate.domain import fleet
    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED

    if not 0 < suspect_below < 1 or min_peers < 2:
        raise UsageError(
            f"--suspect-below {suspect_below:g} / --min-peers {min_peers}: a fraction between 0 and 1, "
            "and 2 peers or more",
            hint="e.g. --suspect-below 0.1 --min-peers 3",
        )
    if key is not None and unsigned:
        raise UsageError("--key and --unsigned: check the signatures, or not", hint="give one of them")
    judged = fleet.judge(_read(nodes, key), suspect_below=suspect_below, min_peers=min_peers)
    _print(judged, fmt, {"signaturesChecked": key is not None, "unsigned": unsigned})
    if key is None and not unsigned:
        print(
            "imagegate: not accepted: no --key, so no attempt is verified and every node is unverified; "
            "give --key PUB to check them, or --unsigned to judge them at their word",
            file=sys.stderr,
        )
    fit = all(j.verdict == "fit" for j in judged.nodes) and (key is not None or unsigned)
    raise typer.Exit(EXIT_ACCEPTED if fit else EXIT_REJECTED)


def _print(judged: "fleet.Fleet", fmt: Format, extra: dict[str, object]) -> None:
    """The fleet report, a table or JSON (with `extra` keys), on stdout."""
    import json

    from imagegate.domain import fleet

    if fmt is Format.json:
        print(json.dumps({**fleet.as_json(judged), **extra}, indent=1))
    else:
        for line in fleet.table(judged):
            print(line)


def _node(name: str, stage: "StageResult", evidence: str, refused: "list[str]") -> "fleet.Node":
    """A node as the fleet judges it, from its node check stage."""
    from imagegate.attest import nodecheck
    from imagegate.domain import fleet

    data = stage.data
    return fleet.Node(
        name, stage.status.value, fleet.gpu_model(data), fleet.figures_of(data), stage.detail,
        gpus=tuple(nodecheck.gpu_uuids(data)), evidence=evidence, refused=tuple(refused),
    )  # fmt: skip


def _read(given: list[str], key: Path | None) -> "list[fleet.Node]":
    """Each NODE=ATTEMPT as a fleet.Node, from the attempt's signed statement and its node check's
    evidence, with what says the attempt is not that node's own (nodecheck.problems)."""
    from imagegate.attest import keys, nodecheck
    from imagegate.domain import fleet
    from imagegate.report.load import read_attempt

    public = keys.load_public_key(key) if key else None
    read: list[fleet.Node] = []
    seen: set[object] = set()
    for item in given:
        name, attempt = _node_attempt(item, seen)
        record = read_attempt(attempt, public).record
        stage = fleet.node_check(record)
        if stage is None:
            raise UsageError(f"{item}: this attempt ran no node check", hint="run -p gpu on the node")
        refused = nodecheck.problems(name, attempt, record, public)
        evidence = "unverified" if public is None else "refused" if refused else "verified"
        read.append(_node(name, stage, evidence, refused))
    return read


def _node_attempt(item: str, seen: set[object]) -> tuple[str, Path]:
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


@fleet_app.command(
    "render",
    epilog="Reads the nodes (and the pods, to skip nodes with GPU work) as kubectl prints them: "
    "`kubectl get nodes -o json`, `kubectl get pods -A -o json`. Each GPU node (labelled "
    "nvidia.com/gpu.product by the GPU operator, or with allocatable nvidia.com/gpu) gets its own "
    "Secret, ConfigMap and Job, pinned to it (kubernetes.io/hostname), requesting all its GPUs, "
    "tolerating a cordon (check a node after cordoning it), running the node check (-p gpu) in "
    "IMAGE, each object validated against the Kubernetes schemas. MIG-partitioned nodes, nodes "
    "without allocatable GPUs and nodes with GPU work running are named on stderr and skipped.\n\n"
    "Examples:\n\n"
    "  kubectl get nodes -o json > nodes.json; kubectl get pods -A -o json > pods.json\n\n"
    "  imagegate fleet render myorg/torch@sha256:<digest> --nodes nodes.json --pods pods.json | kubectl apply -f -",
)
def render(
    image: str = _IMAGE,
    nodes: Path = _NODES,
    pods: Path | None = _PODS,
    namespace: str = _app.KUBE_NAMESPACE,
    kube_version: str = _app.KUBE_VERSION,
) -> None:
    """Print one node check Job (with its Secret and ConfigMap) per GPU node of a cluster."""
    import sys

    for n, job in enumerate(_node_jobs(image, nodes, pods, namespace, kube_version)):
        sys.stdout.write(("---\n" if n else "") + job.rendered.yaml())  # one YAML stream, every node's


def _node_jobs(
    image: str, nodes: Path, pods: Path | None, namespace: str, kube_version: str
) -> "list[fleetrun.NodeJob]":
    """One node check Job per GPU node of the listings (the skipped ones named on stderr)."""
    import hashlib
    import sys

    from imagegate.domain import fleet
    from imagegate.kube import fleetrun
    from imagegate.kube import render as kube_render
    from imagegate.usecases import runner

    found, skipped = fleet.targets(_listing(nodes, "nodes"), _listing(pods, "pods") if pods else None)
    for why in skipped:
        print(f"imagegate: skipped {why}", file=sys.stderr)
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
        jobs.append(fleetrun.NodeJob(t.node, prep, rendered))
    return jobs


def _listing(path: Path, what: str) -> dict[str, object]:
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


@fleet_app.command(
    "run",
    epilog="Each GPU node's node check Job, as `fleet render` makes it, run as `pod run` runs one: "
    "created, waited for, collected into an attempt under --out, deleted (also on an interrupt "
    "or at the deadline; what may be left is named, with the command that removes it). At most "
    "--jobs nodes at a time, all within --timeout. With a signing key each node's attempt is "
    "signed, and beside it the node's own statement (node-check.dsse.json: the node and its "
    "GPUs' UUIDs as subject). Then the fleet report, as `fleet report` prints it. Exit 0 when "
    "every node is fit, 1 when one is suspect or unfit, 2 when a node has no result (not started "
    "before the deadline, or the cluster refused), 3 for unreadable input.\n\n"
    "Examples:\n\n"
    "  imagegate fleet run myorg/torch@sha256:<digest> --jobs 2 --nodes nodes.json --pods pods.json -n checks",
)
def run_cmd(
    image: str = _IMAGE,
    jobs: int = Option(4, "--jobs", min=1, metavar="N", help="Nodes checked at once."),
    nodes: Path = _NODES,
    pods: Path | None = _PODS,
    namespace: str = _app.KUBE_NAMESPACE,
    kube_version: str = _app.KUBE_VERSION,
    context: str | None = _app.KUBE_CONTEXT,
    timeout: float = _app.TIMEOUT,
    out: Path = _OUT,
    key: list[str] = _app.SIGNING_KEY,
    fmt: Format = _app.FORMAT,
) -> None:
    """Run the node check on every GPU node, N at a time within one deadline; report the fleet."""
    from imagegate.cli import _accept as o
    from imagegate.cli import _checks
    from imagegate.domain.results import RunRecord
    from imagegate.kube import fleetrun, kubectl, podrun

    notify = o.notifier(fmt is Format.json)
    with o.interrupts():
        node_jobs = _node_jobs(image, nodes, pods, namespace, kube_version)
        outputs = _checks.outputs(key=o.signing_key(key), reference=image, notify=notify, warn=o.warn)

        def attempt(job: fleetrun.NodeJob, observer: podrun.PodRunObserver) -> RunRecord:
            return _accept_one(job, observer, out / job.node, outputs, notify)

        runs = fleetrun.run_fleet(
            node_jobs,
            kubectl.KubectlCluster(context=context),
            attempt,
            parallel=jobs,
            deadline_s=timeout,
            notify=notify,
        )
    _report_runs(runs, outputs.key, fmt)


def _accept_one(
    job: "fleetrun.NodeJob",
    observer: "accept.Observer",
    out: Path,
    outputs: "accept.Outputs",
    notify: "Notify",
) -> "RunRecord":
    """The one call of the acceptance use case for a node's Job (its observer: the Job's run)."""
    from imagegate.usecases import accept

    return accept.accept(accept.Request(job.prep, observer, out, outputs), notify).record


def _report_runs(runs: "list[fleetrun.NodeRun]", key: "keys.SigningKey | None", fmt: Format) -> None:
    """Each node's statement signed beside its attempt (with a key), then the fleet report; the
    exit code says whether a node is unfit, or has no result at all."""
    from imagegate.attest import nodecheck
    from imagegate.domain import fleet
    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNDECIDED

    nodes, no_result = [], []
    for r in runs:
        stage = fleet.node_check(r.record) if r.record else None
        if r.record is None or stage is None:
            no_result.append(r.node)
            nodes.append(fleet.Node(r.node, "ERROR", "unknown", {}, r.error or "no node check ran"))
            continue
        nodes.append(_node(r.node, stage, "this run", nodecheck.ran_elsewhere(r.node, r.record)))
        if key is not None:
            nodecheck.sign_attempt(r.node, r.record, key)
    judged = fleet.judge(nodes)
    _print(judged, fmt, {"attempts": {r.node: r.record.attempt_dir for r in runs if r.record}})
    if all(j.verdict == "fit" for j in judged.nodes):
        raise typer.Exit(EXIT_ACCEPTED)
    raise typer.Exit(EXIT_UNDECIDED if no_result else EXIT_REJECTED)


@fleet_app.command(
    "collect",
    epilog="The node check Jobs applied earlier (`fleet render ... | kubectl apply -f -`), each "
    "collected as `pod collect --job` collects one: its Pod, log and event key read from the "
    "cluster by the Job's name (the same names `fleet render` gives for the same --nodes), into "
    "an attempt under --out; nothing is deleted. Then the fleet report and exit codes as for "
    "`fleet run`.\n\nExamples:\n\n"
    "  imagegate fleet collect myorg/torch@sha256:<digest> --nodes nodes.json -n checks --key ci.key",
)
def collect_cmd(
    image: str = _IMAGE,
    out: Path = _OUT,
    key: list[str] = _app.SIGNING_KEY,
    fmt: Format = _app.FORMAT,
    nodes: Path = _NODES,
    pods: Path | None = _PODS,
    namespace: str = _app.KUBE_NAMESPACE,
    kube_version: str = _app.KUBE_VERSION,
    context: str | None = _app.KUBE_CONTEXT,
) -> None:
    """Collect every GPU node's node check Job run earlier; report the fleet."""
    from imagegate.cli import _accept as o
    from imagegate.cli import _checks
    from imagegate.errors import EngineError
    from imagegate.kube import fleetrun, kubectl, podrun
    from imagegate.kube.collect import PodObserver

    notify = o.notifier(fmt is Format.json)
    outputs = _checks.outputs(key=o.signing_key(key), reference=image, notify=notify, warn=o.warn)
    cluster, runs = kubectl.KubectlCluster(context=context), []
    for job in _node_jobs(image, nodes, pods, namespace, kube_version):
        run = fleetrun.NodeRun(job.node)
        try:
            pod, log, secret = podrun.pod_and_log(cluster, job.rendered.name, namespace, notify=notify)
            observer = PodObserver(pod, log, secret=secret, notify=notify)
            run.record = _accept_one(job, observer, out / job.node, outputs, notify)
        except (EngineError, UsageError) as e:  # this node has no result; the others still count
            run.error = str(e)
        runs.append(run)
    _report_runs(runs, outputs.key, fmt)
