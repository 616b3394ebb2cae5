"""From a finished Pod (its status JSON and its log) to a run record: the controller's events
from the log, the image the cluster really ran from `status.containerStatuses[].imageID`, a
stage comparing that with the expected digest, the outside stages, the evidence and the
statement, all written outside the cluster."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagegate.domain import protocol
from imagegate.domain.evidence import Attempt
from imagegate.domain.gpus import Grant
from imagegate.domain.results import EvidenceFile, ImageFacts, StageResult, Status
from imagegate.drivers.interface import BundleRun
from imagegate.errors import UsageError
from imagegate.kube.render import BUNDLE_ANNOTATION, CONTAINER, EVENT_KEY_ENV, GPU_RESOURCE
from imagegate.oci.digest import is_digest
from imagegate.oci.reference import parse_image_name
from imagegate.usecases.runner import ControllerRun, Notify, Observation, Prepared

IMAGE_ID_STAGE = "image_id"
# Runtimes prefix imageID differently: docker (dockershim, cri-dockerd) with docker-pullable://
# or docker://; containerd and CRI-O give the repo digest bare, or only the local image ID.
_SCHEMES = ("docker-pullable://", "docker://")


@dataclass(frozen=True)
class ImageID:
    """`status.containerStatuses[].imageID`, taken apart."""

    raw: str
    repository: str | None = None
    digest: str | None = None  # the repo digest: a manifest, or for multi-arch images an index
    local_id: str | None = None  # the runtime's image ID (config digest) when that is all it says


def parse_image_id(raw: str) -> ImageID:
    text = raw.strip()
    for scheme in _SCHEMES:
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    name, at, digest = text.rpartition("@")
    if at and is_digest(digest):
        return ImageID(raw, repository=name or None, digest=digest)
    if is_digest(text):
        return ImageID(raw, local_id=text)
    return ImageID(raw)


def pod_from_json(data: Any) -> dict[str, Any]:
    """A Pod, or a List/PodList holding one (`kubectl get pods -l ... -o json`)."""
    if isinstance(data, dict) and data.get("kind") == "Pod":
        return data
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        pods = [p for p in data["items"] if isinstance(p, dict) and p.get("kind", "Pod") == "Pod"]
        if len(pods) == 1:
            return pods[0]
        raise UsageError(
            f"the Pod JSON lists {len(pods)} Pods; expected one",
            hint="kubectl get pod NAME -o json > pod.json",
        )
    raise UsageError("the Pod JSON is not a Pod", hint="kubectl get pod NAME -o json > pod.json")


def read_pod_files(pod: Path, logs: Path) -> tuple[dict[str, Any], bytes]:
    """A finished Pod saved as files: its JSON (`kubectl get pod -o json`) and its log."""
    try:
        data = json.loads(pod.read_text())
        log = logs.read_bytes()
    except OSError as e:
        raise UsageError(f"{e.filename}: {e.strerror}") from e
    except ValueError as e:
        raise UsageError(f"{pod}: not JSON ({e})", hint="kubectl get pod NAME -o json > pod.json") from e
    return pod_from_json(data), log


MAX_SECRET_BYTES = 1 << 20  # the API server's own limit for a Secret


def read_secret_file(path: Path) -> dict[str, Any]:
    """The run's event key Secret saved as a file: `kubectl get secret NAME -o json`, or the YAML
    `pod render --secret-out` wrote (JSON is YAML: one reader for both)."""
    import yaml

    from imagegate._support.files import read_named

    hint = "kubectl get secret NAME -o json > secret.json (NAME: the Job's name)"
    raw = read_named(path, what="--secret", max_bytes=MAX_SECRET_BYTES)
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not JSON or YAML ({e})", hint=hint) from e
    if not isinstance(data, dict) or data.get("kind") != "Secret":
        raise UsageError(f"{path}: not a Secret", hint=hint)
    return data


def container_status(pod: dict[str, Any], container: str = CONTAINER) -> dict[str, Any] | None:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    named = [s for s in statuses if s.get("name") == container]
    found = named or statuses[:1]
    return dict(found[0]) if found else None


def image_facts(pod: dict[str, Any], container: str = CONTAINER) -> tuple[ImageFacts, ImageID | None]:
    spec = next(
        (c for c in pod.get("spec", {}).get("containers", []) if c.get("name") == container),
        (pod.get("spec", {}).get("containers") or [{}])[0],
    )
    reference = str(spec.get("image") or "unknown")
    status = container_status(pod, container)
    raw = str((status or {}).get("imageID") or "")
    if not raw:
        return ImageFacts(reference=reference, config_digest=None, repository=_repository(reference)), None
    iid = parse_image_id(raw)
    facts = ImageFacts(
        reference=reference,
        config_digest=iid.local_id,
        manifest_digest=iid.digest,
        repo_digests=(f"{iid.repository}@{iid.digest}",) if iid.repository and iid.digest else (),
        repository=iid.repository or _repository(reference),
    )
    return facts, iid


def _repository(reference: str) -> str | None:
    """The repository the Pod's image names, as written; None for an image ID or a name that is
    not a reference (the statement then names the image by its reference)."""
    try:
        return parse_image_name(reference, "the Pod's image").repository
    except UsageError:
        return None


def bundle_run(pod: dict[str, Any], log: bytes, container: str = CONTAINER) -> BundleRun:
    """The Pod log is the controller's stdout and stderr interleaved; the events parser ignores
    lines that are not events, so the whole log goes in as stdout. What the image printed besides
    events, and how the container ended, go in as stderr: the reason of a cut run is there."""
    status = container_status(pod, container) or {}
    state = status.get("state") or {}
    term = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    pod_status = pod.get("status", {})
    pod_reason = pod_status.get("reason")
    exit_code = term.get("exitCode") if term else None
    timed_out = pod_reason == "DeadlineExceeded" or (term or {}).get("reason") == "DeadlineExceeded"
    error = None
    if term:
        ending = f"container terminated: {term.get('reason', '?')} (exit {exit_code})"
        if term.get("message"):
            ending += f": {str(term['message']).strip()}"
    elif "waiting" in state:
        waiting = state["waiting"] or {}
        ending = f"the container never ran: {waiting.get('reason', 'waiting')}"
        if waiting.get("message"):
            ending += f": {waiting['message']}"
        error = ending
    elif "running" in state:
        ending = error = "the container is still running: collect after it finished"
    else:
        ending = error = f"the Pod has no container status (phase {pod_status.get('phase', '?')})"
    if pod_reason or pod_status.get("message"):
        ending += f"; Pod {pod_reason or ''}: {pod_status.get('message', '')}".rstrip(": ")
        if timed_out:
            error = f"the Pod's deadline was reached ({pod_status.get('message', 'DeadlineExceeded')})"
    if term and term.get("reason") == "OOMKilled":
        error = f"OOMKilled: the container went over its memory limit (exit {exit_code})"
    foreign = [ln for ln in log.splitlines() if not ln.startswith(protocol.MARK + b" ")]
    stderr = b"\n".join([*foreign[-200:], ending.encode()]) + b"\n"
    return BundleRun(
        stdout=log,
        stderr=stderr,
        exit_code=None if error else exit_code,  # the reason in words, not a bare 137
        timed_out=timed_out,
        interpreter=_command(pod, container),
        tried=[_command(pod, container) or "?"],
        error=error,
        stdout_total=len(log),
        stderr_total=len(stderr),
        facts={
            "pod": pod.get("metadata", {}).get("name"),
            "node": pod.get("spec", {}).get("nodeName"),
            "phase": pod_status.get("phase"),
            "container_state": state,
            "restart_count": status.get("restartCount"),
        },
        gpus=pod_grant(pod, container),
    )


def pod_grant(pod: dict[str, Any], container: str = CONTAINER) -> Grant | None:
    """The GPUs the cluster gave the container, as the Pod it ran says them (its limits of the
    device plugin's resource), read from the cluster: never the image's own report."""
    for c in pod.get("spec", {}).get("containers") or []:
        if isinstance(c, dict) and c.get("name") == container:
            limits = (c.get("resources") or {}).get("limits") or {}
            count = str(limits.get(GPU_RESOURCE) or "0")
            return Grant("pod_limits", (f"{GPU_RESOURCE}={count}",)) if count != "0" else None
    return None


def key_secret(pod: dict[str, Any], container: str = CONTAINER) -> tuple[str, str] | None:
    """The Secret (name, data key) the Pod's event key comes from (`secretKeyRef`), if it does."""
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") != container:
            continue
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef") if isinstance(e, dict) else None
            if e.get("name") == EVENT_KEY_ENV and isinstance(ref, dict):
                name, key = ref.get("name"), ref.get("key")
                return (name, key) if isinstance(name, str) and isinstance(key, str) else None
    return None


def event_key(
    pod: dict[str, Any], secret: dict[str, Any] | None = None, container: str = CONTAINER
) -> bytes | None:
    """The run's event key (the runner's side of the channel): from the Secret the Pod's env
    refers to, or from the env itself for a Pod rendered before keys moved into Secrets."""
    ref = key_secret(pod, container)
    if ref is not None:
        if secret is None or secret.get("metadata", {}).get("name") != ref[0]:
            return None
        value = (secret.get("data") or {}).get(ref[1])
        try:
            return bytes.fromhex(base64.b64decode(str(value), validate=True).decode("ascii"))
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") != container:
            continue
        for e in c.get("env") or []:
            if e.get("name") == EVENT_KEY_ENV and isinstance(e.get("value"), str):
                try:
                    return bytes.fromhex(e["value"])
                except ValueError:
                    return None
    return None


def missing_key(pod: dict[str, Any], secret: dict[str, Any] | None) -> str:
    """Why `event_key` found no key, and what to do, in words."""
    ref = key_secret(pod)
    if ref is None:
        return "the Pod carries no event key: render it again with this imagegate"
    name = ref[0]
    if secret is None:
        return (
            f"the Pod's event key is in secret/{name}, which collect was not given: collect with "
            f"--job while the Secret exists, or give --secret FILE (kubectl get secret {name} -o json)"
        )
    given = secret.get("metadata", {}).get("name")
    if given != name:
        return f"the Secret given is secret/{given}, but the Pod's event key is in secret/{name}"
    return f"secret/{name} holds no hex event key under {ref[1]!r}"


def _command(pod: dict[str, Any], container: str) -> str | None:
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == container and c.get("command"):
            return str(c["command"][0])
    return None


def environment(pod: dict[str, Any], iid: ImageID | None, container: str = CONTAINER) -> dict[str, Any]:
    status = container_status(pod, container) or {}
    runtime = str(status.get("containerID") or "").partition("://")[0] or None
    meta = pod.get("metadata", {})
    owners = [o.get("name") for o in meta.get("ownerReferences", []) if o.get("kind") == "Job"]
    return {
        "driver": "kube",
        "engine": runtime,  # containerd, cri-o, docker: from the containerID's scheme
        "namespace": meta.get("namespace"),
        "pod": meta.get("name"),
        "job": owners[0] if owners else None,
        "node": pod.get("spec", {}).get("nodeName"),
        "image": status.get("image"),
        "image_id": iid.raw if iid else None,
        "key_isolation": {"method": "pod"},  # signed where `pod collect` runs, never in the cluster
    }


def image_id_stage(
    iid: ImageID | None, expected: Sequence[str], evidence: Sequence[EvidenceFile] = ()
) -> StageResult:
    """Is what the cluster ran the image we meant? Compares the repo digest in imageID (or the
    local image ID, when that is all the runtime reports) with the expected digests."""

    def result(status: Status, detail: str, **data: Any) -> StageResult:
        base = {"image_id": iid.raw if iid else None, "expected": list(expected)}
        return StageResult(
            IMAGE_ID_STAGE, IMAGE_ID_STAGE, "outside", status, detail, 0.0, {**base, **data}, list(evidence)
        )

    if iid is None:
        return result(Status.ERROR, "the Pod status has no imageID: the container never started")
    seen = iid.digest or iid.local_id
    if seen is None:
        return result(Status.ERROR, f"imageID {iid.raw!r} holds no sha256 digest")
    if not expected:
        return result(
            Status.SKIPPED,
            f"ran {iid.raw}; nothing to compare with: pin the image by digest or give --expect-digest",
        )
    if seen in expected:
        kind = "repo digest" if iid.digest else "local image ID (config digest)"
        return result(Status.PASS, f"{kind} {seen} as expected ({iid.raw})")
    if iid.digest is None:
        return result(
            Status.ERROR,
            f"the runtime reported only its local image ID {iid.local_id} (config digest), which "
            f"cannot be compared with {', '.join(expected)}; give the config digest to --expect-digest",
        )
    return result(
        Status.FAIL,
        f"the cluster ran {iid.digest} ({iid.raw}), expected {', '.join(expected)}; "
        "for a multi-arch image imageID may name the index, not the platform manifest",
    )


def expected_digests(pod: dict[str, Any], given: Sequence[str], container: str = CONTAINER) -> list[str]:
    """--expect-digest, else the digest the Pod's image is pinned to."""
    for d in given:
        if not is_digest(d):
            raise UsageError(f"--expect-digest {d!r}: expected sha256:<64 hex digits>")
    if given:
        return list(dict.fromkeys(given))
    ref = image_facts(pod, container)[0].reference
    _, at, pinned = ref.rpartition("@")
    return [pinned] if at and is_digest(pinned) else []


class PodObserver:
    """The Pod path's way of observing (Pod mode is one more driver): a finished Pod's status
    and log. `job_failure`: why the Job ended early when the caller knows (e.g. its deadline)."""

    def __init__(
        self,
        pod: dict[str, Any],
        log: bytes,
        *,
        secret: dict[str, Any] | None = None,
        expect_digests: Sequence[str] = (),
        job_failure: str | None = None,
        notify: Notify = lambda _m: None,
    ) -> None:
        self.pod, self.log, self.job_failure, self.notify = pod, log, job_failure, notify
        self.secret = secret  # the run's event key Secret (the Pod's env refers to it)
        self.expected = expected_digests(pod, expect_digests)
        self.image, self.iid = image_facts(pod)
        self.reference: str | None = self.image.reference

    def subject(self, prep: Prepared) -> ImageFacts:
        annotated = self.pod.get("metadata", {}).get("annotations", {}).get(BUNDLE_ANNOTATION)
        if annotated and annotated != prep.bundle.sha256:
            raise UsageError(
                f"the Pod ran bundle {annotated[:12]}…, but this pipeline and these modules give "
                f"{prep.bundle.sha256[:12]}…",
                hint="give collect the same -p and -m as pod render",
            )
        if not annotated:
            self.notify("the Pod carries no bundle digest annotation: assuming it ran this pipeline's bundle")
        return self.image

    def left_behind(self) -> str | None:
        return None  # reads files and the cluster; starts nothing

    def observe(self, prep: Prepared, attempt: Attempt) -> Observation:
        pod, iid = self.pod, self.iid
        pod_file = attempt.write_json("pod.json", pod)
        br = bundle_run(pod, self.log)
        key = event_key(pod, self.secret)
        events = protocol.read_all(key or protocol.new_key(), prep.stage_ids, self.log)
        if key is None:
            events.violations.insert(0, missing_key(pod, self.secret))
            events.violations_total += 1
        else:
            br.facts["event_key"] = key.hex()  # spent: published so the event log can be re-checked
        if self.job_failure:
            br.error = self.job_failure
            br.timed_out = br.timed_out or "deadline" in self.job_failure.lower()
        # Outside stages (layers) read the very image the cluster ran, by its digest.
        source = f"docker://{iid.repository}@{iid.digest}" if iid and iid.repository and iid.digest else None
        return Observation(
            image=self.image,
            environment=environment(pod, iid),
            runs=[ControllerRun(prep.stage_ids, br, events)],
            started=_started(pod),
            driver="kube",
            source=source,
            given=[image_id_stage(iid, self.expected, [pod_file])],
        )


def _started(pod: dict[str, Any]) -> str:
    started = pod.get("status", {}).get("startTime")
    if isinstance(started, str):
        return started
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
