"""pod collect on Pod JSON fixtures written from the Kubernetes API reference
(tests/kube/fixtures/README.md) and logs the real controller printed in real images (no API
server can start here): events from the log, the real imageID from the status, the digest check,
evidence and the statement outside the cluster."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.domain.results import RunRecord, Status
from imagegate.errors import UsageError
from imagegate.kube import collect
from imagegate.kube.render import BUNDLE_ANNOTATION, GPU_RESOURCE, SECRET_KEY
from imagegate.usecases import accept, runner
from tests.helpers import controller_output, imagegate


def collect_record(
    prep: runner.Prepared, pod: dict[str, Any], log: bytes, opts: runner.RunOptions, **kw: Any
) -> RunRecord:
    """A finished Pod through the accept use case, as `pod collect` runs it, unsigned."""
    observer = collect.PodObserver(pod, log, **kw)
    return accept.accept(accept.Request(prep, observer, opts.out)).record


FIXTURES = Path(__file__).parent / "fixtures"
RAN = "sha256:" + "5f" * 32  # the digest in the fixtures' imageID
OTHER = "sha256:" + "9a" * 32
LOCAL = "sha256:" + "c0" * 32


KEY = bytes(range(32))  # the event key the fixtures' Secret holds (render makes a fresh one a run)
NOISE = b"WARNING: the image printed this line itself; it is kept as evidence and ignored\n"
JOB = "imagegate-python-3f2a9c1e"  # the fixtures' Job: render names its Secret after it


def secret(key: bytes = KEY, name: str = JOB) -> dict[str, Any]:
    """The Secret as `kubectl get secret NAME -o json` gives it (the API server adds metadata)."""
    data = {SECRET_KEY: base64.b64encode(key.hex().encode()).decode()}
    meta = {"name": name, "namespace": "default", "uid": "0f6e4c1a-5b2d-4e8f-9a7c-3d1b2e4f5a6b"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": data}


def pod(name: str, keyed: bool = True) -> dict[str, Any]:
    """A fixture Pod whose env takes the event key from its Secret, as render writes it."""
    obj = collect.pod_from_json(json.loads((FIXTURES / name).read_text()))
    if keyed:
        ref = {"secretKeyRef": {"name": JOB, "key": SECRET_KEY}}
        obj["spec"]["containers"][0].setdefault("env", []).append(
            {"name": "IMAGEGATE_EVENT_KEY", "valueFrom": ref}
        )
    return obj


_LOGS: dict[str, bytes] = {}


def log(name: str) -> bytes:
    """The real controller's output in a real image: `pass` (python image), `pip-conflict`
    (real conflicting wheels), `cut` (the pass log cut after its first stage event)."""
    if name not in _LOGS:
        prep = runner.prepare(runner.RunOptions(pipeline="python", modules=["json"]))
        if name == "pip-conflict":
            _LOGS[name] = controller_output(prep, KEY, "imagegate-test/conflict:latest")
        else:
            full = controller_output(prep, KEY, "imagegate-test/python:latest", noise=NOISE)
            if name == "cut":
                mark = b"imagegate-event 2 4 "  # the second stage's event (0 start, then a stage_start before each stage)
                full = full[: full.index(mark)]
            _LOGS[name] = full
    return _LOGS[name]


def run(tmp: Path, pod_file: str, log_name: str, expect: tuple[str, ...] = ()) -> RunRecord:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp)
    prep = runner.prepare(opts)
    return collect_record(prep, pod(pod_file), log(log_name), opts, secret=secret(), expect_digests=expect)


def stage(record: RunRecord, sid: str) -> Any:
    return next(s for s in record.stages if s.id == sid)


@pytest.mark.parametrize(
    ("raw", "repository", "digest", "local"),
    [
        (f"docker.io/myorg/app@{RAN}", "docker.io/myorg/app", RAN, None),  # containerd, CRI-O
        (f"docker-pullable://myorg/app@{RAN}", "myorg/app", RAN, None),  # docker
        (f"docker://{LOCAL}", None, None, LOCAL),  # docker, no repo digest
        (LOCAL, None, None, LOCAL),  # containerd, image loaded locally
        (f"localhost:5000/a/b@{RAN}", "localhost:5000/a/b", RAN, None),  # a port is not a tag
        ("", None, None, None),
    ],
)
def test_parse_image_id(raw: str, repository: str | None, digest: str | None, local: str | None) -> None:
    iid = collect.parse_image_id(raw)
    assert (iid.repository, iid.digest, iid.local_id) == (repository, digest, local)


@pytest.mark.parametrize(
    ("fixture", "engine"),
    [
        ("pod-containerd-succeeded.json", "containerd"),
        ("pod-crio-succeeded.json", "cri-o"),
        ("pod-docker-succeeded.json", "docker"),
    ],
)
def test_pass_with_the_expected_digest(tmp_path: Path, fixture: str, engine: str) -> None:
    # No --expect-digest: the digest the Pod's image is pinned to is the expectation.
    record = run(tmp_path, fixture, "pass")
    assert record.verdict == "PASS", [(s.id, s.status, s.detail) for s in record.stages]
    assert [s.id for s in record.stages] == ["image_id", "pip_check", "find_spec"]
    assert stage(record, "image_id").status is Status.PASS
    assert record.image.manifest_digest == RAN
    assert record.environment["driver"] == "kube" and record.environment["engine"] == engine
    assert record.environment["job"] == "imagegate-python-3f2a9c1e"
    assert record.environment["python"].startswith("3.11.")  # the python image's (Debian 12)
    attempt = Path(record.attempt_dir)
    statement = json.loads((attempt / "statement.json").read_text())
    assert statement["subject"][0]["digest"] == {"sha256": RAN.split(":")[1]}
    assert json.loads((attempt / "pod.json").read_text())["metadata"]["name"].startswith("imagegate-")
    assert (attempt / "controller.events.log").read_bytes().count(
        b"imagegate-event 2 "
    ) == 6  # start, 2 × (stage_start, stage), end
    # What the image printed itself is kept as evidence.
    assert b"the image printed this line" in (attempt / "controller.stderr.log").read_bytes()


def test_the_run_names_the_pod_uid_and_the_container_the_runtime_ran() -> None:
    facts = collect.bundle_run(pod("pod-containerd-succeeded.json"), b"").facts
    assert facts["pod_uid"] == "0d6f1f7e-8a49-4c3e-9a55-3b0c4c1d2e11"
    assert str(facts["container_id"]).startswith("containerd://4b1d2c3e4f5a"), facts
    # A Pod that never started a container has no container ID to name.
    assert collect.bundle_run(pod("pod-image-pull-backoff.json"), b"").facts["container_id"] is None


def test_digest_mismatch_is_fail_naming_both(tmp_path: Path) -> None:
    record = run(tmp_path, "pod-containerd-succeeded.json", "pass", expect=(OTHER,))
    s = stage(record, "image_id")
    assert s.status is Status.FAIL and record.verdict == "FAIL"
    assert RAN in s.detail and OTHER in s.detail


def test_any_of_several_expected_digests(tmp_path: Path) -> None:
    record = run(tmp_path, "pod-docker-succeeded.json", "pass", expect=(OTHER, RAN))
    assert stage(record, "image_id").status is Status.PASS


def test_local_image_id_only(tmp_path: Path) -> None:
    # Unpinned image and a runtime that reports only its local ID: nothing to compare.
    record = run(tmp_path, "pod-containerd-local-id.json", "pass")
    assert stage(record, "image_id").status is Status.SKIPPED and record.verdict == "PASS"
    assert record.image.config_digest == LOCAL and record.image.manifest_digest is None
    # A manifest digest cannot be compared with a local ID: could not decide.
    record = run(tmp_path, "pod-containerd-local-id.json", "pass", expect=(RAN,))
    assert stage(record, "image_id").status is Status.ERROR and record.verdict == "ERROR"
    # The config digest can.
    record = run(tmp_path, "pod-containerd-local-id.json", "pass", expect=(LOCAL,))
    assert stage(record, "image_id").status is Status.PASS


def test_pip_conflict_in_the_log_is_fail(tmp_path: Path) -> None:
    record = run(tmp_path, "pod-containerd-succeeded.json", "pip-conflict")
    assert record.verdict == "FAIL"
    assert "moviepy 2.2.1 has requirement pillow<12.0,>=9.2.0" in stage(record, "pip_check").detail


def test_never_started_is_error_with_the_reason(tmp_path: Path) -> None:
    record = collect_record(
        runner.prepare(runner.RunOptions(pipeline="python", modules=["json"])),
        pod("pod-image-pull-backoff.json"),
        b"",
        runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path),
    )
    assert record.verdict == "ERROR"
    assert stage(record, "image_id").status is Status.ERROR
    for sid in ("pip_check", "find_spec"):
        s = stage(record, sid)
        assert s.status is Status.ERROR and "ImagePullBackOff" in s.detail, s.detail


def test_missing_interpreter_names_it(tmp_path: Path) -> None:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path)
    record = collect_record(runner.prepare(opts), pod("pod-start-error.json"), b"", opts)
    detail = stage(record, "pip_check").detail
    assert stage(record, "pip_check").status is Status.ERROR
    assert "StartError" in detail and "python3" in detail, detail


def test_cut_run_never_passes_missing_stages(tmp_path: Path) -> None:
    record = run(tmp_path, "pod-deadline-exceeded.json", "cut")
    assert stage(record, "pip_check").status is Status.PASS
    s = stage(record, "find_spec")
    assert s.status is Status.ERROR and "deadline" in s.detail, s.detail
    assert record.verdict == "ERROR"


def test_bundle_annotation_must_match(tmp_path: Path) -> None:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path)
    prep = runner.prepare(opts)
    good = pod("pod-containerd-succeeded.json")
    good["metadata"]["annotations"][BUNDLE_ANNOTATION] = prep.bundle.sha256
    assert collect_record(prep, good, log("pass"), opts, secret=secret()).verdict == "PASS"
    good["metadata"]["annotations"][BUNDLE_ANNOTATION] = "0" * 64
    with pytest.raises(UsageError, match="ran bundle 000000000000"):
        collect_record(prep, good, log("pass"), opts)


def test_pod_list_with_one_pod(tmp_path: Path) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [pod("pod-crio-succeeded.json")]}
    assert collect.pod_from_json(listed)["metadata"]["name"]
    with pytest.raises(UsageError, match="2 Pods"):
        collect.pod_from_json({"kind": "List", "items": [listed["items"][0]] * 2})


def test_a_log_from_another_run_is_not_trusted(tmp_path: Path) -> None:
    # The Pod's key is not the one the log's events were made with: nothing is accepted.
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path)
    prep = runner.prepare(opts)
    other = secret(bytes(32))
    record = collect_record(prep, pod("pod-containerd-succeeded.json"), log("pass"), opts, secret=other)
    assert record.verdict == "ERROR"
    integrity = stage(record, "event_integrity")
    assert "fails authentication" in integrity.detail, integrity.detail
    assert stage(record, "pip_check").status is Status.ERROR


def test_a_pod_without_a_key_is_not_trusted(tmp_path: Path) -> None:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path)
    prep = runner.prepare(opts)
    record = collect_record(prep, pod("pod-containerd-succeeded.json", False), log("pass"), opts)
    assert record.verdict == "ERROR"
    assert "no event key" in stage(record, "event_integrity").detail


def test_the_key_comes_from_the_secret_the_pod_names(tmp_path: Path) -> None:
    """The Pod holds only a reference: its events are authenticated with the Secret it names,
    and without that Secret (or with another run's) nothing is accepted, and the detail says
    which Secret to give."""
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path)
    prep = runner.prepare(opts)
    ok = collect_record(prep, pod("pod-containerd-succeeded.json"), log("pass"), opts, secret=secret())
    assert ok.verdict == "PASS", [(s.id, s.status, s.detail) for s in ok.stages]
    assert KEY.hex() not in json.dumps(pod("pod-containerd-succeeded.json"))
    missing = collect_record(prep, pod("pod-containerd-succeeded.json"), log("pass"), opts)
    assert missing.verdict == "ERROR"
    assert f"secret/{JOB}" in stage(missing, "event_integrity").detail
    assert "--secret FILE" in stage(missing, "event_integrity").detail
    wrong = secret(KEY, "imagegate-other-00000000")
    other = collect_record(prep, pod("pod-containerd-succeeded.json"), log("pass"), opts, secret=wrong)
    assert other.verdict == "ERROR" and "imagegate-other" in stage(other, "event_integrity").detail
    # A Pod rendered before keys moved into Secrets (the key in its env) is still read.
    legacy = pod("pod-containerd-succeeded.json", False)
    legacy["spec"]["containers"][0]["env"] = [{"name": "IMAGEGATE_EVENT_KEY", "value": KEY.hex()}]
    assert collect_record(prep, legacy, log("pass"), opts).verdict == "PASS"


def test_cli_exit_codes(tmp_path: Path) -> None:
    log_file = tmp_path / "pod.log"
    log_file.write_bytes(log("pass"))
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(pod("pod-containerd-succeeded.json")))
    secret_file = tmp_path / "secret.json"
    secret_file.write_text(json.dumps(secret()))

    def cli(*extra: str) -> Any:
        return imagegate(
            "pod", "collect", "--logs", str(log_file),
            "--pod", str(pod_file), "--secret", str(secret_file),
            "-p", "python", "-m", "json", "-o", str(tmp_path), *extra,
        )  # fmt: skip

    ok = cli()
    assert ok.returncode == 0, ok.stderr
    assert "IMAGE_ID_PASS" in ok.stdout or "image_id" in ok.stdout
    bad = cli("--expect-digest", OTHER)
    assert bad.returncode == 1, bad.stderr
    assert OTHER in bad.stdout.replace("\n", "") or OTHER[:20] in bad.stdout
    as_json = cli("--format", "json")
    assert as_json.returncode == 0 and as_json.json()["_type"].startswith("https://in-toto.io/")
    usage = imagegate("pod", "collect", "--logs", str(log_file), "-p", "python")
    assert usage.returncode == 3 and "--pod FILE" in usage.stderr
    no_job = cli("--timeout", "5")
    assert no_job.returncode == 3 and "--timeout goes with --job" in no_job.stderr
    not_secret = imagegate(
        "pod", "collect", "--logs", str(log_file), "--pod", str(pod_file), "--secret", str(pod_file),
        "-p", "python", "-m", "json", "-o", str(tmp_path),
    )  # fmt: skip
    assert not_secret.returncode == 3 and "not a Secret" in not_secret.stderr, not_secret.stderr
    reported = cli("--report", f"junit={tmp_path}/reports/junit.xml")
    assert reported.returncode == 0, reported.stderr
    assert 'name="image_id"' in (tmp_path / "reports" / "junit.xml").read_text()


def test_the_gpus_a_pod_was_given_are_its_limits_as_the_cluster_says_them() -> None:
    """The runner's fact for a Pod: the device plugin's resource in the container's limits, as
    the Pod read back from the cluster says it (never the image's report of a GPU)."""

    def with_limits(limits: dict[str, str] | None, name: str = collect.CONTAINER) -> dict[str, Any]:
        container = {"name": name, **({"resources": {"limits": limits}} if limits is not None else {})}
        return {
            "spec": {
                "containers": [{"name": "sidecar", "resources": {"limits": {GPU_RESOURCE: "8"}}}, container]
            }
        }

    grant = collect.pod_grant(with_limits({"cpu": "2", GPU_RESOURCE: "2"}))
    assert grant is not None and (grant.via, grant.seen, grant.granted) == (
        "pod_limits",
        (f"{GPU_RESOURCE}=2",),
        True,
    )
    assert collect.pod_grant(with_limits({GPU_RESOURCE: "0"})) is None
    assert collect.pod_grant(with_limits({"cpu": "2"})) is None
    assert collect.pod_grant(with_limits(None)) is None
    assert (
        collect.pod_grant(with_limits({GPU_RESOURCE: "1"}, name="other")) is None
    )  # only the sidecar has one
    assert collect.bundle_run(with_limits({GPU_RESOURCE: "1"}), b"").gpus == collect.pod_grant(
        with_limits({GPU_RESOURCE: "1"})
    )
