"""`pod run`: wait out the previous run, create the Secret, the ConfigMap and the Job, wait for the Pod to
finish within the deadline, collect, delete. Everything goes through the Cluster interface.

A re-run waits until the previous Pod is really gone rather than failing: a Terminating Pod
cannot be replaced, and fields such as nodeSelector cannot be changed in place."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from imagegate._support.jsontypes import JsonMapping, number, obj, objects, path, text
from imagegate.domain.evidence import Attempt
from imagegate.domain.results import ImageFacts
from imagegate.errors import UsageError
from imagegate.kube.cluster import Cluster, ClusterError
from imagegate.kube.collect import PodObserver, key_secret, read_pod_files, read_secret_file
from imagegate.kube.render import CONTAINER, ENFORCE_LABEL, POD_SECURITY_LEVELS, RUN_LABEL, Rendered
from imagegate.usecases.runner import Notify, Observation, Prepared

KINDS = ("job", "configmap", "secret")


@dataclass
class JobState:
    """How far a `pod run` got with its objects, for what an interrupt may leave."""

    created: bool = False
    deleted: bool = False


# Waiting reasons that no amount of waiting fixes: stop now and report them.
HOPELESS = ("InvalidImageName", "ErrImageNeverPull")
FINISH_GRACE_S = 120.0  # after activeDeadlineSeconds: the Job controller's own reaction time


@dataclass(frozen=True)
class Waits:
    poll_s: float = 2.0
    gone_timeout_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class PodRunObserver:
    """`pod run` as the acceptance use case's observer: `subject` runs the Job (and deletes it
    unless `keep`), then the finished Pod is observed as `pod collect` observes one."""

    def __init__(
        self,
        rendered: Rendered,
        cluster: Cluster,
        *,
        expect_digests: Sequence[str] = (),
        keep: bool = False,
        limit_s: float | None = None,
        waits: Waits = Waits(),
        notify: Notify = lambda _m: None,
    ) -> None:
        self.rendered, self.cluster, self.keep, self.waits = rendered, cluster, keep, waits
        self.limit_s = limit_s
        self.expect_digests, self.notify = expect_digests, notify
        self.reference: str | None = rendered.image
        self.collected: PodObserver | None = None
        self.state = JobState()

    def subject(self, prep: Prepared) -> ImageFacts:
        pod, log, failure = run_job(
            self.rendered,
            self.cluster,
            keep=self.keep,
            limit_s=self.limit_s,
            waits=self.waits,
            notify=self.notify,
            state=self.state,
        )
        self.collected = PodObserver(
            pod,
            log,
            secret=self.rendered.secret,  # the key this run created: no need to read it back
            expect_digests=self.expect_digests,
            job_failure=failure,
            notify=self.notify,
        )
        return self.collected.subject(prep)

    def observe(self, prep: Prepared, attempt: Attempt) -> Observation:
        assert self.collected is not None, "subject() first"
        return self.collected.observe(prep, attempt)

    def left_behind(self) -> str | None:
        if not self.state.created or self.state.deleted:
            return None
        ns, name = self.rendered.namespace, self.rendered.name
        why = "kept (--keep)" if self.keep else "may be left"
        return (
            f"job/{name}, configmap/{name} and secret/{name} {why}: "
            f"kubectl delete job,configmap,secret {name} -n {ns}"
        )


def check_pod_security(rendered: Rendered, cluster: Cluster) -> None:
    """A namespace that enforces a stricter Pod Security level than the Job's Pod meets stores the
    Job and never makes its Pod: refused before anything is created, naming both levels."""
    try:
        found = cluster.get("namespace", rendered.namespace, rendered.namespace)
    except ClusterError:  # not allowed to read namespaces: nothing to tell before creating
        return
    enforced = text(path(found or {}, "metadata", "labels", ENFORCE_LABEL))
    levels = POD_SECURITY_LEVELS
    if enforced not in levels or levels.index(enforced) >= levels.index(rendered.pod_security):
        return
    why = {
        "baseline": "it runs as root (--run-as-user 0)",
        "privileged": "it mounts a node's folder (--model-host-path)",
    }
    raise UsageError(
        f"namespace {rendered.namespace} enforces Pod Security `{enforced}`, and the Job's Pod meets only "
        f"`{rendered.pod_security}`: {why[rendered.pod_security]}; its Pod would never be created",
        hint=f"run in a namespace labelled {ENFORCE_LABEL}={rendered.pod_security}, or drop the option",
    )


def run_job(
    rendered: Rendered,
    cluster: Cluster,
    *,
    keep: bool,
    limit_s: float | None = None,
    waits: Waits = Waits(),
    notify: Notify = lambda _m: None,
    state: JobState | None = None,
) -> tuple[dict[str, object], bytes, str | None]:
    """Wait out the previous run, create, wait for the Pod to finish (`limit_s`, default: the
    Job's deadline and a grace period), read its log, delete: the finished Pod, its log, and
    why the Job ended early if it did. `state`: updated as the objects are created and deleted."""
    state = state or JobState()
    ns, name = rendered.namespace, rendered.name
    check_pod_security(rendered, cluster)
    wait_gone(cluster, name, ns, waits, notify)
    notify(f"creating secret/{name}, configmap/{name} and job/{name} in {ns}")
    state.created = True  # before the call: an interrupt inside it may have created some
    cluster.create(rendered.objects)
    try:
        limit = limit_s or _active_deadline_s(rendered.job) + FINISH_GRACE_S
        pod, failure = wait_finished(cluster, name, ns, limit, waits, notify)
        if pod is None:
            raise ClusterError(
                f"job/{name}: no Pod to collect ({failure or 'it never appeared'})",
                hint=f"kubectl describe job {name} -n {ns}",
            )
        pod_name = _name(pod)
        try:
            log = cluster.logs(pod_name, ns, CONTAINER)
        except ClusterError as e:  # e.g. never started: the status still tells why
            notify(f"no log from pod/{pod_name}: {e}")
            log = b""
        return pod, log, failure
    finally:
        if not keep:
            for kind in KINDS:
                cluster.delete(kind, name, ns)
            state.deleted = True


def pod_and_log(
    cluster: Cluster,
    job: str,
    ns: str,
    wait_s: float | None = None,
    waits: Waits = Waits(),
    notify: Notify = lambda _m: None,
) -> tuple[dict[str, object], bytes, dict[str, object] | None]:
    """The newest Pod of a Job run earlier (by our label, or the Job controller's), its log and
    the Secret holding its event key (None when gone or not readable: collect then says so);
    `wait_s`: first wait up to that long for it to finish."""
    if wait_s:
        wait_finished(cluster, job, ns, wait_s, waits, notify)
    pods = cluster.pods(ns, _selector(job)) or cluster.pods(ns, f"job-name={job}")
    pod = _newest(pods)
    if pod is None:
        raise UsageError(
            f"job/{job} in {ns}: no Pod found", hint="is it still there? (ttlSecondsAfterFinished)"
        )
    log = cluster.logs(_name(pod), ns, CONTAINER)
    ref, secret = key_secret(pod), None
    if ref is not None:
        try:
            secret = cluster.get("secret", ref[0], ns)
        except ClusterError as e:  # e.g. no RBAC right to read Secrets
            notify(f"could not read secret/{ref[0]}, which holds the run's event key: {e}")
    return pod, log, secret


def finished_pod(
    logs: Path | None,
    pod: Path | None,
    job: str | None,
    ns: str,
    context: str | None = None,
    wait_s: float | None = None,
    notify: Notify = lambda _m: None,
    secret: Path | None = None,
) -> tuple[dict[str, object], bytes, dict[str, object] | None]:
    """The Pod `pod collect` is given, its log and its event key Secret: saved as files (its log,
    JSON and Secret JSON), or read from the cluster by Job name (`wait_s`: first wait up to that
    long for it to finish)."""
    if (logs is None and pod is None) == (job is None) or (logs is None) != (pod is None):
        raise UsageError("give either --logs FILE --pod FILE [--secret FILE], or --job NAME")
    if wait_s is not None and job is None:
        raise UsageError("--timeout goes with --job", hint="a Pod given as files has finished already")
    if secret is not None and job is not None:
        raise UsageError(
            "--secret goes with --logs and --pod", hint="with --job the Secret is read from the cluster"
        )
    if job is None:
        assert pod is not None and logs is not None
        return (*read_pod_files(pod, logs), read_secret_file(secret) if secret else None)
    from imagegate.kube.kubectl import KubectlCluster

    return pod_and_log(KubectlCluster(context=context), job, ns, wait_s, notify=notify)


def _selector(name: str) -> str:
    return f"{RUN_LABEL}={name}"


def _name(resource: JsonMapping) -> str:
    """An API object's `metadata.name` (the server always gives one; "?" stands in otherwise)."""
    return text(path(resource, "metadata", "name")) or "?"


def _active_deadline_s(job: JsonMapping) -> float:
    """The rendered Job's activeDeadlineSeconds (render always sets it)."""
    seconds = number(path(job, "spec", "activeDeadlineSeconds"))
    if seconds is None:
        raise KeyError("activeDeadlineSeconds")
    return seconds


def wait_gone(cluster: Cluster, name: str, ns: str, waits: Waits, notify: Notify) -> None:
    """Delete what a previous run with this name left, then wait until its Pods are gone."""
    for kind in KINDS:
        if cluster.get(kind, name, ns) is not None:
            notify(f"deleting the previous run's {kind}/{name}")
            cluster.delete(kind, name, ns)
    end = waits.clock() + waits.gone_timeout_s
    told: set[str] = set()
    while True:
        pods = cluster.pods(ns, _selector(name))
        left = [k for k in KINDS if cluster.get(k, name, ns) is not None]
        if not pods and not left:
            return
        for pod in pods:
            pname = _name(pod)
            if not path(pod, "metadata", "deletionTimestamp") and not left:
                cluster.delete("pod", pname, ns)  # an orphan of an earlier Job: nothing owns it now
            if pname not in told:
                told.add(pname)
                notify(
                    f"waiting until the previous pod/{pname} is gone (a Terminating Pod cannot be replaced)"
                )
        if waits.clock() >= end:
            what = ", ".join([*(f"pod/{_name(p)}" for p in pods), *(f"{k}/{name}" for k in left)])
            raise ClusterError(
                f"the previous run is still there after {waits.gone_timeout_s:g}s: {what}",
                hint=f"kubectl get pods -n {ns} -l {_selector(name)}; re-run once it is gone",
            )
        waits.sleep(waits.poll_s)


def _job_failure(job: JsonMapping | None) -> str | None:
    for cond in objects(path(job, "status", "conditions")):
        if cond.get("type") in ("Failed", "FailureTarget") and cond.get("status") == "True":
            return f"the Job failed: {cond.get('reason', '?')}: {cond.get('message', '')}".rstrip(": ")
    return None


def _newest(pods: list[dict[str, object]]) -> dict[str, object] | None:
    return max(pods, key=lambda p: str(obj(p.get("metadata")).get("creationTimestamp", "")), default=None)


def wait_finished(
    cluster: Cluster, name: str, ns: str, limit_s: float, waits: Waits, notify: Notify
) -> tuple[dict[str, object] | None, str | None]:
    """The finished Pod (Succeeded or Failed), and why the Job ended early if it did."""
    end = waits.clock() + limit_s
    told: set[str] = set()
    while True:
        pod = _newest(cluster.pods(ns, _selector(name)))
        if pod is not None and path(pod, "status", "phase") in ("Succeeded", "Failed"):
            return pod, None
        failure = _job_failure(cluster.get("job", name, ns))
        if failure:
            return pod, failure
        for why in _pending_reasons(pod):
            if why not in told:
                told.add(why)
                notify(why)
            if why.split(":", 1)[0] in HOPELESS:
                return pod, None
        if waits.clock() >= end:
            return pod, f"no result within {limit_s:g}s"
        waits.sleep(waits.poll_s)


def _pending_reasons(pod: JsonMapping | None) -> list[str]:
    """What a not-yet-running Pod waits for, in words: unschedulable, pulling, backing off."""
    if pod is None:
        return []
    out = []
    for cond in objects(path(pod, "status", "conditions")):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            out.append(f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}")
    for cs in objects(path(pod, "status", "containerStatuses")):
        waiting = obj(path(cs, "state", "waiting"))
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            out.append(f"{waiting['reason']}: {waiting.get('message', '')}")
    return out
