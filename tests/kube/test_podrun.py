"""pod run's orchestration through the Cluster interface. No API server can start here, so
FakeCluster stands in for one (and only for that): it keeps objects, lets a deleted Pod stay
Terminating for a while, and runs the Job's Pod through Pending to Succeeded. The Pod's log is a
real controller run of the real bundle on this machine."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from imagegate.domain.results import RunRecord, Status
from imagegate.errors import UsageError
from imagegate.kube import collect, podrun, render
from imagegate.kube.cluster import ClusterError
from imagegate.usecases import accept, runner
from tests.helpers import controller_output


def run_pod(
    prep: runner.Prepared, rendered: render.Rendered, cluster: Any, opts: runner.RunOptions, **kw: Any
) -> RunRecord:
    """One run in a Pod through the accept use case, as `pod run` runs it, unsigned."""
    observer = podrun.PodRunObserver(rendered, cluster, **kw)
    return accept.accept(accept.Request(prep, observer, opts.out)).record


FIXTURES = Path(__file__).parent / "fixtures"
DIGEST = "sha256:" + "5f" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeCluster:
    """Stands in for the API server (fake: none can start in these tests)."""

    def __init__(
        self, log: Callable[[bytes], bytes], *, terminating_polls: int = 3, pending_polls: int = 2
    ) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pod_list: list[dict[str, Any]] = []
        self.log = log
        self.calls: list[str] = []
        self.terminating_polls = terminating_polls
        self.pending_polls = pending_polls
        self.job_failure: dict[str, Any] | None = None

    def leave_previous_run(self, name: str) -> None:
        for kind in podrun.KINDS:
            self.objects[(kind, name)] = {"kind": kind, "metadata": {"name": name}}
        old = json.loads((FIXTURES / "pod-containerd-succeeded.json").read_text())
        old["metadata"]["name"] = f"{name}-old"
        old["metadata"]["labels"][render.RUN_LABEL] = name
        self.pod_list.append(old)

    def create(self, objects: Sequence[dict[str, Any]]) -> None:
        self.calls.append("create")
        assert not self.pod_list, "created while the previous Pod was still there"
        for obj in objects:
            key = (obj["kind"].lower(), obj["metadata"]["name"])
            assert key not in self.objects, f"{key} already exists"
            self.objects[key] = copy.deepcopy(obj)
            if obj["kind"] == "Job":
                self.pod_list.append(self._pod_for(obj))

    def _pod_for(self, job: dict[str, Any]) -> dict[str, Any]:
        tmpl = job["spec"]["template"]
        pod = json.loads((FIXTURES / "pod-containerd-succeeded.json").read_text())
        pod["metadata"].update(name=job["metadata"]["name"] + "-abcde", labels=tmpl["metadata"]["labels"])
        pod["metadata"]["annotations"] = tmpl["metadata"]["annotations"]
        pod["spec"]["containers"] = tmpl["spec"]["containers"]
        pod["status"] = {
            "phase": "Pending",
            "containerStatuses": [{"name": "probe", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        }
        return pod

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, name))
        if obj is not None and kind == "job" and self.job_failure:
            obj = dict(obj, status={"conditions": [self.job_failure]})
        return obj

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append("pods")
        for pod in list(self.pod_list):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                meta["_polls"] = meta.get("_polls", 0) + 1
                if meta["_polls"] > self.terminating_polls:
                    self.pod_list.remove(pod)
            elif pod["status"]["phase"] == "Pending":
                meta["_polls"] = meta.get("_polls", 0) + 1
                if meta["_polls"] > self.pending_polls and not self.job_failure:
                    ok = json.loads((FIXTURES / "pod-containerd-succeeded.json").read_text())
                    pod["status"] = ok["status"]
        key, _, value = selector.partition("=")
        return [copy.deepcopy(p) for p in self.pod_list if p["metadata"]["labels"].get(key) == value]

    def delete(self, kind: str, name: str, namespace: str) -> None:
        self.calls.append(f"delete {kind}/{name}")
        self.objects.pop((kind, name), None)
        if kind == "job":  # cascade: its Pods start terminating
            for pod in self.pod_list:
                pod["metadata"].setdefault("deletionTimestamp", "2026-11-29T10:30:00Z")
        if kind == "pod":
            for pod in self.pod_list:
                if pod["metadata"]["name"] == name:
                    pod["metadata"].setdefault("deletionTimestamp", "2026-11-29T10:30:00Z")

    def logs(self, pod: str, namespace: str, container: str) -> bytes:
        """What the real controller printed, with the event key the Pod was given."""
        self.calls.append(f"logs {pod}")
        found = next(p for p in self.pod_list if p["metadata"]["name"] == pod)
        ref = collect.key_secret(found)
        key = collect.event_key(found, self.objects.get(("secret", ref[0])) if ref else None)
        assert key is not None
        return self.log(key)


@pytest.fixture(scope="module")
def prep() -> runner.Prepared:
    return runner.prepare(runner.RunOptions(pipeline="python", modules=["json"]))


@pytest.fixture(scope="module")
def real_log(prep: runner.Prepared) -> Callable[[bytes], bytes]:
    """The controller's real output for this bundle and an event key, as the Pod would log it."""
    made: dict[bytes, bytes] = {}

    def make(key: bytes) -> bytes:
        if key not in made:
            made[key] = controller_output(prep, key)
        return made[key]

    return make


def _rendered(prep: runner.Prepared, **kw: Any) -> render.Rendered:
    return render.render(prep, f"myorg/app@{DIGEST}", render.PodOptions(namespace="accept", **kw))


def test_rerun_waits_until_the_previous_pod_is_gone(
    tmp_path: Path, prep: runner.Prepared, real_log: Callable[[bytes], bytes]
) -> None:
    r = _rendered(prep)
    cluster = FakeCluster(real_log, terminating_polls=3)
    cluster.leave_previous_run(r.name)
    clock, notes = Clock(), list[str]()
    waits = podrun.Waits(poll_s=2, clock=clock, sleep=clock.sleep)
    record = run_pod(
        prep, r, cluster, runner.RunOptions(pipeline="python", out=tmp_path), waits=waits, notify=notes.append
    )
    by_id = {s.id: s for s in record.stages}
    assert by_id["image_id"].status is Status.PASS and record.stages[0].id == "image_id"
    # The stages ran (pip check judges this machine's environment: PASS or FAIL, never ERROR).
    assert by_id["find_spec"].status is Status.PASS, by_id["find_spec"].detail
    assert by_id["pip_check"].status in (Status.PASS, Status.FAIL), by_id["pip_check"].detail
    # The old objects were deleted, then creation waited for the Terminating Pod to be gone.
    first_create = cluster.calls.index("create")
    assert cluster.calls[:3] == [
        f"delete job/{r.name}",
        f"delete configmap/{r.name}",
        f"delete secret/{r.name}",
    ]
    assert cluster.calls[:first_create].count("pods") > 3
    assert any("Terminating Pod cannot be replaced" in n for n in notes)
    # Collected, then cleaned up.
    assert f"logs {r.name}-abcde" in cluster.calls
    assert cluster.calls[-3:] == [
        f"delete job/{r.name}",
        f"delete configmap/{r.name}",
        f"delete secret/{r.name}",
    ]
    assert (Path(record.attempt_dir) / "statement.json").is_file()


def test_gives_up_when_the_previous_pod_never_goes(
    prep: runner.Prepared, real_log: Callable[[bytes], bytes]
) -> None:
    r = _rendered(prep)
    cluster = FakeCluster(real_log, terminating_polls=10**6)
    cluster.leave_previous_run(r.name)
    clock = Clock()
    waits = podrun.Waits(poll_s=5, gone_timeout_s=60, clock=clock, sleep=clock.sleep)
    with pytest.raises(ClusterError, match="still there after 60s"):
        run_pod(prep, r, cluster, runner.RunOptions(pipeline="python"), waits=waits)
    assert "create" not in cluster.calls


def test_job_deadline_is_error_not_pass(
    tmp_path: Path, prep: runner.Prepared, real_log: Callable[[bytes], bytes]
) -> None:
    r = _rendered(prep, deadline_s=600)

    def cut(key: bytes) -> bytes:  # start and the first stage only
        full = real_log(key)
        return full[: full.index(b"imagegate-event 2 4 ")]

    cluster = FakeCluster(cut, pending_polls=10**6)
    cluster.job_failure = {
        "type": "Failed",
        "status": "True",
        "reason": "DeadlineExceeded",
        "message": "Job was active longer than specified deadline",
    }
    clock = Clock()
    record = run_pod(
        prep,
        r,
        cluster,
        runner.RunOptions(pipeline="python", out=tmp_path),
        waits=podrun.Waits(poll_s=2, clock=clock, sleep=clock.sleep),
    )
    assert record.verdict == "ERROR"
    inside = [s for s in record.stages if s.side == "inside" and s.status is Status.ERROR]
    assert inside and all("DeadlineExceeded" in s.detail for s in inside), [s.detail for s in inside]
    assert f"delete job/{r.name}" in cluster.calls[-3:]


def test_keep_leaves_the_objects(
    tmp_path: Path, prep: runner.Prepared, real_log: Callable[[bytes], bytes]
) -> None:
    r = _rendered(prep)
    cluster = FakeCluster(real_log)
    clock = Clock()
    run_pod(
        prep,
        r,
        cluster,
        runner.RunOptions(pipeline="python", out=tmp_path),
        keep=True,
        waits=podrun.Waits(clock=clock, sleep=clock.sleep),
    )
    assert not [c for c in cluster.calls if c.startswith("delete")]
    assert {("job", r.name), ("configmap", r.name), ("secret", r.name)} <= set(cluster.objects)


def test_pod_and_log_of_an_earlier_job(prep: runner.Prepared, real_log: Callable[[bytes], bytes]) -> None:
    r = _rendered(prep)
    cluster = FakeCluster(real_log, pending_polls=0)
    cluster.create(r.objects)
    pod, log, secret = podrun.pod_and_log(cluster, r.name, "accept")
    # The Pod holds only the reference: the key is read from the Secret it names.
    assert collect.event_key(pod) is None and secret == r.secret
    key = collect.event_key(pod, secret)
    assert key is not None and pod["metadata"]["name"] == f"{r.name}-abcde" and log == real_log(key)
    with pytest.raises(UsageError, match="no Pod found"):
        podrun.pod_and_log(cluster, "other", "accept")


def test_cli_pod_run_writes_reports_of_the_signed_statement(
    tmp_path: Path,
    real_log: Callable[[bytes], bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pod run --report`: the same reports as `run`, made from the statement that was signed.
    The command runs in-process so that FakeCluster can stand in for the API server behind
    kubectl (none can start here); everything else is the real command."""
    import base64

    from typer.testing import CliRunner

    from imagegate.cli import app

    cluster = FakeCluster(real_log, pending_polls=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # the default key, made on first use
    reports = tmp_path / "reports"
    result = CliRunner().invoke(
        app,
        [
            "pod", "run", f"myorg/app@{DIGEST}", "-p", "python", "-m", "json", "-n", "accept",
            "-o", str(tmp_path / "runs"), "--report", f"json={reports}/statement.json",
            "--report", f"junit={reports}/junit.xml", "--report", f"markdown={reports}/summary.md",
        ],
    )  # fmt: skip
    # pip check judges this machine's environment: PASS or FAIL, never ERROR.
    assert result.exit_code in (0, 1), result.output
    (attempt,) = (tmp_path / "runs").glob("*/*/")
    signed = json.loads((attempt / "attestation.dsse.json").read_text())
    payload = json.loads(base64.b64decode(signed["payload"]))
    assert json.loads((reports / "statement.json").read_text()) == payload
    assert (reports / "statement.json").read_text() == (attempt / "statement.json").read_text()
    junit = (reports / "junit.xml").read_text()
    assert 'name="image_id"' in junit and 'name="find_spec"' in junit, junit
    assert payload["predicate"]["verdict"] in (summary := (reports / "summary.md").read_text()), summary
    assert not cluster.objects  # the Job, the ConfigMap and the Secret were deleted after the run


def test_cli_pod_run_interrupted_says_what_may_be_left(
    tmp_path: Path, real_log: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while `pod run` reads the Pod's log: exit 130, the Job still deleted (as on any
    end), and the message names what may be left: the Job, until its TTL. In-process, with
    FakeCluster for the API server behind kubectl (none can start here)."""
    from typer.testing import CliRunner

    from imagegate.cli import app

    class Interrupting(FakeCluster):
        def logs(self, pod: str, namespace: str, container: str) -> bytes:
            raise KeyboardInterrupt

    cluster = Interrupting(real_log, pending_polls=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    args = [
        "pod",
        "run",
        f"myorg/app@{DIGEST}",
        "-p",
        "python",
        "-m",
        "json",
        "--no-sign",
        "-o",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    # Deleted, as on any end: nothing is left, and the message says no more than that.
    assert not cluster.objects and "delete job/" in " ".join(cluster.calls)
    assert "interrupted; nothing was left running" in result.output, result.output


def test_cli_pod_run_interrupted_while_deleting_names_the_job(
    tmp_path: Path, real_log: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the Job is being deleted: exit 130 and the message names the Job and
    ConfigMap that may be left, with the command that removes them (FakeCluster, as above)."""
    from typer.testing import CliRunner

    from imagegate.cli import app

    class InterruptedDelete(FakeCluster):
        def delete(self, kind: str, name: str, namespace: str) -> None:
            raise KeyboardInterrupt

    cluster = InterruptedDelete(real_log, pending_polls=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    args = ["pod", "run", f"myorg/app@{DIGEST}", "-p", "python", "--no-sign", "-o", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    assert cluster.objects, "the fake's delete was interrupted: the objects are still there"
    name = next(n for kind, n in cluster.objects if kind == "job")
    expected = (
        f"job/{name}, configmap/{name} and secret/{name} may be left: "
        f"kubectl delete job,configmap,secret {name} -n default"
    )
    assert expected in result.output, result.output
