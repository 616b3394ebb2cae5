"""Commands: fleet render, run, collect and report. Parse, call imagegate.fleet, print."""

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer import Argument

from imagegate.cli import _app
from imagegate.cli._accept import grouped
from imagegate.cli._app import Format, Option, app
from imagegate.cli._identity import Identity
from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `fleet --help` loads none of the layers below
    from imagegate.attest import keys
    from imagegate.fleet import judge
    from imagegate.fleet.jobs import NodeJob, NodeRun

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
_JOBS = Option(4, "--jobs", min=1, metavar="N", help="Nodes worked on at once.")


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
    "node is refused; keyless (--identity/--identity-regexp, --issuer/--issuer-regexp, "
    "--trusted-root, for a fleet run signed with a sigstore: signer) the attempt and the node "
    "statement must each prove that identity by its own bundle beside it. Without either every "
    "node is unverified and the report exits 1, unless --unsigned is given. Exit 0 when every node is fit, 1 when one is suspect, unfit or "
    "refused (or nothing was verified), 3 for unreadable input.\n\nExamples:\n\n"
    "  imagegate fleet report gpu-1=runs/gpu-1/sha256-…/<attempt> gpu-2=runs/gpu-2/sha256-… gpu-3=… --key ci.pub\n\n"
    "  imagegate fleet report gpu-1=… gpu-2=… gpu-3=… --key ci.pub --suspect-below 0.05 --format json\n\n"
    "  imagegate fleet report gpu-1=… gpu-2=… --identity https://github.com/org/repo/.github/workflows/fleet.yml@refs/heads/main "
    "--issuer https://token.actions.githubusercontent.com --trusted-root trusted_root.json",
)
@grouped
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
    who: Identity = Identity(),
) -> None:
    """Judge every node's node check beside its peers; say which nodes to label or taint."""
    import sys

    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED
    from imagegate.fleet import judge, read

    if not 0 < suspect_below < 1 or min_peers < 2:
        raise UsageError(
            f"--suspect-below {suspect_below:g} / --min-peers {min_peers}: a fraction between 0 and 1, "
            "and 2 peers or more",
            hint="e.g. --suspect-below 0.1 --min-peers 3",
        )
    keyless = who.expected("keyless verification")
    if [key is not None, keyless is not None, unsigned].count(True) > 1:
        raise UsageError(
            "--key, a keyless signer (--identity …) and --unsigned: check the signatures one way, or not",
            hint="give one of them",
        )
    judged = judge.judge(read.attempts(nodes, key, keyless), suspect_below=suspect_below, min_peers=min_peers)
    checked = key is not None or keyless is not None
    _print(judged, fmt, {"signaturesChecked": checked, "unsigned": unsigned})
    if not checked and not unsigned:
        print(
            "imagegate: not accepted: no --key, so no attempt is verified and every node is unverified; "
            "give --key PUB (or the keyless signer: --identity, --issuer, --trusted-root) to check "
            "them, or --unsigned to judge them at their word",
            file=sys.stderr,
        )
    fit = all(j.verdict == "fit" for j in judged.nodes) and (checked or unsigned)
    raise typer.Exit(EXIT_ACCEPTED if fit else EXIT_REJECTED)


def _print(judged: "judge.Fleet", fmt: Format, extra: dict[str, object]) -> None:
    """The fleet report, a table or JSON (with `extra` keys), on stdout."""
    import json

    from imagegate.fleet import judge

    if fmt is Format.json:
        print(json.dumps({**judge.as_json(judged), **extra}, indent=1))
    else:
        for line in judge.table(judged):
            print(line)


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
) -> "list[NodeJob]":
    """The node check Jobs, each GPU node skipped named on stderr."""
    import sys

    from imagegate.fleet import read

    found = read.node_jobs(image, nodes, pods, namespace, kube_version)
    for why in found.skipped:
        print(f"imagegate: skipped {why}", file=sys.stderr)
    return found.jobs


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
    jobs: int = _JOBS,
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
    from imagegate.fleet import jobs as run
    from imagegate.kube import kubectl, podrun

    notify = o.notifier(fmt is Format.json)
    with o.interrupts():
        node_jobs = _node_jobs(image, nodes, pods, namespace, kube_version)
        outputs = _checks.outputs(key=o.signing_key(key), reference=image, notify=notify, warn=o.warn)

        def attempt(job: run.NodeJob, observer: podrun.PodRunObserver) -> RunRecord:
            return run.accept_node(job, observer, out / job.node, outputs, notify)

        runs = run.run_fleet(
            node_jobs,
            kubectl.KubectlCluster(context=context),
            attempt,
            parallel=jobs,
            deadline_s=timeout,
            notify=notify,
        )
    _report_runs(runs, outputs.key, fmt)


def _report_runs(runs: "list[NodeRun]", key: "keys.SigningKey | None", fmt: Format) -> None:
    """The fleet report of a run of the Jobs (read.runs signs each node's statement, with a key);
    the exit code says whether a node is unfit, or has no result at all."""
    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNDECIDED
    from imagegate.fleet import read

    judged = read.runs(runs, key)
    _print(judged.fleet, fmt, {"attempts": {r.node: r.record.attempt_dir for r in runs if r.record}})
    if all(j.verdict == "fit" for j in judged.fleet.nodes):
        raise typer.Exit(EXIT_ACCEPTED)
    raise typer.Exit(EXIT_UNDECIDED if judged.no_result else EXIT_REJECTED)


@fleet_app.command(
    "collect",
    epilog="The node check Jobs applied earlier (`fleet render ... | kubectl apply -f -`), each "
    "collected as `pod collect --job` collects one: its Pod, log and event key read from the "
    "cluster by the Job's name (the same names `fleet render` gives for the same --nodes), into "
    "an attempt under --out, --jobs nodes at a time; nothing is deleted. Then the fleet report "
    "and exit codes as for `fleet run`.\n\nExamples:\n\n"
    "  imagegate fleet collect myorg/torch@sha256:<digest> --nodes nodes.json -n checks --key ci.key",
)
def collect_cmd(
    image: str = _IMAGE,
    jobs: int = _JOBS,
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
    from concurrent.futures import ThreadPoolExecutor

    from imagegate.cli import _accept as o
    from imagegate.cli import _checks
    from imagegate.errors import EngineError
    from imagegate.fleet import jobs as run
    from imagegate.kube import kubectl, podrun
    from imagegate.kube.collect import PodObserver

    notify = o.notifier(fmt is Format.json)
    outputs = _checks.outputs(key=o.signing_key(key), reference=image, notify=notify, warn=o.warn)
    cluster = kubectl.KubectlCluster(context=context)

    def one(job: run.NodeJob) -> run.NodeRun:
        done = run.NodeRun(job.node)
        try:
            pod, log, secret = podrun.pod_and_log(cluster, job.rendered.name, namespace, notify=notify)
            observer = PodObserver(pod, log, secret=secret, notify=notify)
            done.record = run.accept_node(job, observer, out / job.node, outputs, notify)
        except (EngineError, UsageError) as e:  # this node has no result; the others still count
            done.error = str(e)
        return done

    node_jobs = _node_jobs(image, nodes, pods, namespace, kube_version)
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="collect")
    with o.interrupts():
        try:
            runs = list(pool.map(one, node_jobs))  # in the nodes' order
        finally:  # on an interrupt the queued nodes never start; the running ones end with kubectl
            pool.shutdown(wait=True, cancel_futures=True)
    _report_runs(runs, outputs.key, fmt)
