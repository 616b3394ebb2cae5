"""`fleet run`: the node check Jobs of a fleet (as `fleet render` makes them), each run as `pod
run` runs one (kube/podrun.py: create, wait, collect, delete), at most `parallel` at a time and
all within one deadline. A node whose turn comes after the deadline is not started; one running
at the deadline is cut there, collected as it is, and deleted like any other.

Bounded: a fleet is many nodes, and each Job takes all of a node's GPUs; an operator cordons a
few at a time, and the API server and the registry each see a handful of pulls, not one a node."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from imagegate.domain.results import RunRecord
from imagegate.errors import EngineError
from imagegate.kube.cluster import Cluster, ClusterError
from imagegate.kube.podrun import PodRunObserver, Waits
from imagegate.kube.render import Rendered
from imagegate.usecases.accept import Interrupted, Observer, Outputs, Request, accept
from imagegate.usecases.runner import Notify, Prepared

DEFAULT_PARALLEL = 4


@dataclass(frozen=True)
class NodeJob:
    node: str
    prep: Prepared
    rendered: Rendered


@dataclass
class NodeRun:
    """One node's outcome: its run record, or why there is none; and what may be left of it."""

    node: str
    record: RunRecord | None = None
    error: str | None = None
    left: str | None = None


class Stopped(ClusterError):
    """The fleet run was interrupted: a node's wait ends here, and its objects are deleted."""


# One call to the acceptance use case per node (the CLI's): the Job's observer in, a record out.
Attempt = Callable[[NodeJob, PodRunObserver], RunRecord]


def run_fleet(
    jobs: Sequence[NodeJob],
    cluster: Cluster,
    attempt: Attempt,
    *,
    parallel: int = DEFAULT_PARALLEL,
    deadline_s: float,
    expect_digests: Sequence[str] = (),
    waits: Waits = Waits(),
    notify: Notify = lambda _m: None,
) -> list[NodeRun]:
    """Every node's run, in the order given. On an interrupt: the running nodes stop waiting and
    delete their objects, then accept.Interrupted says what may be left, each with its command."""
    end = waits.clock() + deadline_s
    stop = threading.Event()
    runs = [NodeRun(j.node) for j in jobs]

    def sleep(s: float) -> None:
        if stop.is_set():
            raise Stopped("interrupted")
        waits.sleep(s)

    def one(job: NodeJob, run: NodeRun) -> None:
        left = end - waits.clock()
        if left <= 0 or stop.is_set():
            run.error = "not started: " + ("interrupted" if stop.is_set() else "the fleet's deadline passed")
            return
        observer = PodRunObserver(
            job.rendered,
            cluster,
            expect_digests=expect_digests,
            limit_s=left,
            waits=dataclasses.replace(waits, gone_timeout_s=min(waits.gone_timeout_s, left), sleep=sleep),
            notify=lambda m: notify(f"{job.node}: {m}"),
        )
        try:
            run.record = attempt(job, observer)
        except EngineError as e:  # ClusterError and Stopped among them: this node has no record
            run.error = str(e)
        finally:
            run.left = observer.left_behind()

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="fleet") as pool:
        futures = [pool.submit(one, j, r) for j, r in zip(jobs, runs, strict=True)]
        try:
            for f in futures:
                f.result()
        except KeyboardInterrupt:
            stop.set()  # the running ones end their wait and delete; the queued ones never start
            interrupted = True
        else:
            interrupted = False
    if interrupted:  # after every node ended: what may be left is known by then
        raise Interrupted("; ".join(left_behind(runs)) or None)
    return runs


def left_behind(runs: Sequence[NodeRun]) -> list[str]:
    """What the runs may have left in the cluster, each with the command that removes it."""
    return [f"{r.node}: {r.left}" for r in runs if r.left]


def accept_node(job: NodeJob, observer: Observer, out: Path, outputs: Outputs, notify: Notify) -> RunRecord:
    """The acceptance use case for one node's Job (its observer: the Job's run, or its Pod
    collected later)."""
    return accept(Request(job.prep, observer, out, outputs), notify).record
