"""pod collect on Pod JSON fixtures written from the Kubernetes API reference
(tests/kube/fixtures/README.md) and on logs the real controller printed in a real image at test
time (tests/kube/conftest.py): events from the log, the real imageID from the status, the digest
check, evidence and the statement outside the cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagegate import runner
from imagegate.errors import UsageError
from imagegate.kube import collect
from imagegate.kube.render import BUNDLE_ANNOTATION
from imagegate.model import RunRecord, Status
from tests.helpers import imagegate
from tests.kube.conftest import IMAGE_LINE, ControllerLog

FIXTURES = Path(__file__).parent / "fixtures"
RAN = "sha256:" + "5f" * 32  # the digest in the fixtures' imageID
OTHER = "sha256:" + "9a" * 32
LOCAL = "sha256:" + "c0" * 32


def pod(name: str) -> dict[str, Any]:
    return collect.pod_from_json(json.loads((FIXTURES / name).read_text()))


def run(
    tmp: Path, pod_file: str, log: ControllerLog, expect: tuple[str, ...] = (), text: bytes | None = None
) -> RunRecord:
    """collect on a Pod fixture and a real controller log (or `text`, a real log's variant)."""
    stdout = log.stdout if text is None else text
    return collect.collect(log.prep, pod(pod_file), stdout, log.options(tmp), expect_digests=expect)


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
    ("fixture", "runtime"),
    [
        ("pod-containerd-succeeded.json", "containerd"),
        ("pod-crio-succeeded.json", "cri-o"),
        ("pod-docker-succeeded.json", "docker"),
    ],
)
def test_pass_with_the_expected_digest(
    tmp_path: Path, fixture: str, runtime: str, controller_logs: dict[str, ControllerLog]
) -> None:
    # No --expect-digest: the digest the Pod's image is pinned to is the expectation.
    log = controller_logs["pass"]
    record = run(tmp_path, fixture, log, text=log.with_image_line())
    assert record.verdict == "PASS", [(s.id, s.status, s.detail) for s in record.stages]
    assert [s.id for s in record.stages] == ["image_id", "pip_check", "find_spec"]
    assert stage(record, "image_id").status is Status.PASS
    assert record.image.manifest_digest == RAN
    assert record.environment["driver"] == "kube" and record.environment["engine"] == runtime
    assert record.environment["job"] == "imagegate-python-3f2a9c1e"
    assert record.environment["python"].startswith("3.11.")  # Debian 12's, from the start event
    attempt = Path(record.attempt_dir)
    statement = json.loads((attempt / "statement.json").read_text())
    assert statement["subject"][0]["digest"] == {"sha256": RAN.split(":")[1]}
    assert json.loads((attempt / "pod.json").read_text())["metadata"]["name"].startswith("imagegate-")
    assert (attempt / "controller.stdout.jsonl").read_bytes() == log.with_image_line()
    # What the image printed itself is kept as evidence.
    assert IMAGE_LINE.strip() in (attempt / "controller.stderr.log").read_bytes()
    # the stages' facts are the controller's, whole
    mods = statement["predicate"]["stages"][2]["facts"]["modules"]
    assert [(m["module"], m["found"]) for m in mods] == [("json", True)]


def test_digest_mismatch_is_fail_naming_both(
    tmp_path: Path, controller_logs: dict[str, ControllerLog]
) -> None:
    record = run(tmp_path, "pod-containerd-succeeded.json", controller_logs["pass"], expect=(OTHER,))
    s = stage(record, "image_id")
    assert s.status is Status.FAIL and record.verdict == "FAIL"
    assert RAN in s.detail and OTHER in s.detail


def test_any_of_several_expected_digests(tmp_path: Path, controller_logs: dict[str, ControllerLog]) -> None:
    record = run(tmp_path, "pod-docker-succeeded.json", controller_logs["pass"], expect=(OTHER, RAN))
    assert stage(record, "image_id").status is Status.PASS


def test_local_image_id_only(tmp_path: Path, controller_logs: dict[str, ControllerLog]) -> None:
    # Unpinned image and a runtime that reports only its local ID: nothing to compare.
    log = controller_logs["pass"]
    record = run(tmp_path, "pod-containerd-local-id.json", log)
    assert stage(record, "image_id").status is Status.SKIPPED and record.verdict == "PASS"
    assert record.image.config_digest == LOCAL and record.image.manifest_digest is None
    # A manifest digest cannot be compared with a local ID: could not decide.
    record = run(tmp_path, "pod-containerd-local-id.json", log, expect=(RAN,))
    assert stage(record, "image_id").status is Status.ERROR and record.verdict == "ERROR"
    # The config digest can.
    record = run(tmp_path, "pod-containerd-local-id.json", log, expect=(LOCAL,))
    assert stage(record, "image_id").status is Status.PASS


def test_pip_conflict_in_the_log_is_fail(tmp_path: Path, controller_logs: dict[str, ControllerLog]) -> None:
    record = run(tmp_path, "pod-containerd-succeeded.json", controller_logs["pip-conflict"])
    assert record.verdict == "FAIL"
    s = stage(record, "pip_check")
    assert s.status is Status.FAIL and "pillow<12.0,>=9.2.0" in s.detail, s.detail
    # pip's own project and requirement reach the statement, as the controller reported them
    statement = json.loads((Path(record.attempt_dir) / "statement.json").read_text())
    problems = statement["predicate"]["stages"][1]["facts"]["problems"]
    assert {(p["kind"], p["project"]) for p in problems} >= {("conflict", "moviepy"), ("missing", "nixl")}


def test_never_started_is_error_with_the_reason(tmp_path: Path) -> None:
    record = collect.collect(
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
    record = collect.collect(runner.prepare(opts), pod("pod-start-error.json"), b"", opts)
    detail = stage(record, "pip_check").detail
    assert stage(record, "pip_check").status is Status.ERROR
    assert "StartError" in detail and "python3" in detail, detail


def test_cut_run_never_passes_missing_stages(
    tmp_path: Path, controller_logs: dict[str, ControllerLog]
) -> None:
    log = controller_logs["pass"]
    record = run(tmp_path, "pod-deadline-exceeded.json", log, text=log.cut_after("pip_check"))
    assert stage(record, "pip_check").status is Status.PASS
    s = stage(record, "find_spec")
    assert s.status is Status.ERROR and "deadline" in s.detail, s.detail
    assert record.verdict == "ERROR"


def test_bundle_annotation_must_match(tmp_path: Path, controller_logs: dict[str, ControllerLog]) -> None:
    log = controller_logs["pass"]
    opts, prep = log.options(tmp_path), log.prep
    good = pod("pod-containerd-succeeded.json")
    good["metadata"]["annotations"][BUNDLE_ANNOTATION] = prep.bundle.sha256
    assert collect.collect(prep, good, log.stdout, opts).verdict == "PASS"
    good["metadata"]["annotations"][BUNDLE_ANNOTATION] = "0" * 64
    with pytest.raises(UsageError, match="ran bundle 000000000000"):
        collect.collect(prep, good, log.stdout, opts)


def test_pod_list_with_one_pod(tmp_path: Path) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [pod("pod-crio-succeeded.json")]}
    assert collect.pod_from_json(listed)["metadata"]["name"]
    with pytest.raises(UsageError, match="2 Pods"):
        collect.pod_from_json({"kind": "List", "items": [listed["items"][0]] * 2})


def test_cli_exit_codes(tmp_path: Path, controller_logs: dict[str, ControllerLog]) -> None:
    logs = tmp_path / "pod.log"
    logs.write_bytes(controller_logs["pass"].stdout)

    def cli(*extra: str) -> Any:
        return imagegate(
            "pod", "collect", "--logs", str(logs),
            "--pod", str(FIXTURES / "pod-containerd-succeeded.json"),
            "-p", "python", "-m", "json", "-o", str(tmp_path / "runs"), *extra,
        )  # fmt: skip

    ok = cli("--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert ok.json()["_type"] == "https://in-toto.io/Statement/v1"
    st = {s["id"]: s for s in ok.json()["predicate"]["stages"]}
    assert st["image_id"]["token"] == "IMAGE_ID_PASS" and RAN in st["image_id"]["detail"]
    bad = cli("--expect-digest", OTHER, "--format", "json")
    assert bad.returncode == 1, bad.stderr
    image_id = next(s for s in bad.json()["predicate"]["stages"] if s["id"] == "image_id")
    assert image_id["status"] == "FAIL" and OTHER in image_id["detail"] and RAN in image_id["detail"]
    usage = imagegate("pod", "collect", "--logs", str(logs), "-p", "python")
    assert usage.returncode == 3 and "--pod FILE" in usage.stderr
