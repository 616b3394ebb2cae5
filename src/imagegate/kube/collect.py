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

from imagegate._support.jsontypes import (
    JsonMapping,
    JsonObject,
    JsonValue,
    freeze,
    freeze_object,
    integer,
    items,
    obj,
    objects,
    path,
    text,
)
from imagegate.domain import protocol
from imagegate.domain.digest import is_digest
from imagegate.domain.evidence import Attempt
from imagegate.domain.gpus import Grant
from imagegate.domain.results import EvidenceFile, ImageFacts, StageResult, Status
from imagegate.drivers.interface import BundleRun
from imagegate.errors import UsageError
from imagegate.kube.render import BUNDLE_ANNOTATION, CONTAINER, EVENT_KEY_ENV, GPU_RESOURCE
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


def pod_from_json(data: object) -> dict[str, object]:
    """A Pod, or a List/PodList holding one (`kubectl get pods -l ... -o json`)."""
    doc = obj(data)
    if doc.get("kind") == "Pod":
        return doc
    if isinstance(doc.get("items"), list):
        # Every object of the list, an empty one too (it counts as a Pod, as it always did).
        listed = [obj(p) for p in items(doc["items"]) if isinstance(p, dict)]
        pods = [p for p in listed if p.get("kind", "Pod") == "Pod"]
        if len(pods) == 1:
            return pods[0]
        raise UsageError(
            f"the Pod JSON lists {len(pods)} Pods; expected one",
            hint="kubectl get pod NAME -o json > pod.json",
        )
    raise UsageError("the Pod JSON is not a Pod", hint="kubectl get pod NAME -o json > pod.json")


def read_pod_files(pod: Path, logs: Path) -> tuple[dict[str, object], bytes]:
    """A finished Pod saved as files: its JSON (`kubectl get pod -o json`) and its log."""
    try:
        data: object = json.loads(pod.read_text())
        log = logs.read_bytes()
    except OSError as e:
        raise UsageError(f"{e.filename}: {e.strerror}") from e
    except ValueError as e:
        raise UsageError(f"{pod}: not JSON ({e})", hint="kubectl get pod NAME -o json > pod.json") from e
    return pod_from_json(data), log


MAX_SECRET_BYTES = 1 << 20  # the API server's own limit for a Secret


def read_secret_file(path: Path) -> dict[str, object]:
    """The run's event key Secret saved as a file: `kubectl get secret NAME -o json`, or the YAML
    `pod render --secret-out` wrote (JSON is YAML: one reader for both)."""
    import yaml

    from imagegate._support.files import read_named

    hint = "kubectl get secret NAME -o json > secret.json (NAME: the Job's name)"
    raw = read_named(path, what="--secret", max_bytes=MAX_SECRET_BYTES)
    try:
        data: object = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not JSON or YAML ({e})", hint=hint) from e
    secret = obj(data)
    if secret.get("kind") != "Secret":
        raise UsageError(f"{path}: not a Secret", hint=hint)
    return secret


def _containers(pod: JsonMapping) -> list[dict[str, object]]:
    """The Pod's `spec.containers`."""
    return objects(path(pod, "spec", "containers"))


def container_status(pod: JsonMapping, container: str = CONTAINER) -> dict[str, object] | None:
    statuses = objects(path(pod, "status", "containerStatuses"))
    named = [s for s in statuses if s.get("name") == container]
    found = named or statuses[:1]
    return dict(found[0]) if found else None


def image_facts(pod: JsonMapping, container: str = CONTAINER) -> tuple[ImageFacts, ImageID | None]:
    containers = _containers(pod)
    spec = next((c for c in containers if c.get("name") == container), (containers or [{}])[0])
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


def bundle_run(pod: JsonMapping, log: bytes, container: str = CONTAINER) -> BundleRun:
    """The Pod log is the controller's stdout and stderr interleaved; the events parser ignores
    lines that are not events, so the whole log goes in as stdout. What the image printed besides
    events, and how the container ended, go in as stderr: the reason of a cut run is there."""
    status = container_status(pod, container) or {}
    state = obj(status.get("state"))
    term = obj(state.get("terminated")) or obj(path(status, "lastState", "terminated"))
    pod_status = obj(pod.get("status"))
    pod_reason = pod_status.get("reason")
    exit_code = integer(term.get("exitCode")) if term else None
    timed_out = pod_reason == "DeadlineExceeded" or term.get("reason") == "DeadlineExceeded"
    error = None
    if term:
        ending = f"container terminated: {term.get('reason', '?')} (exit {exit_code})"
        if term.get("message"):
            ending += f": {str(term['message']).strip()}"
    elif "waiting" in state:
        waiting = obj(state["waiting"])
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
        facts=freeze_object(
            {
                "pod": path(pod, "metadata", "name"),
                # Which Pod and container ran it, as the cluster names them: a name is reused by
                # a later run under the same --name, the UID and the runtime's container ID never.
                "pod_uid": path(pod, "metadata", "uid"),
                "container_id": status.get("containerID"),
                "node": path(pod, "spec", "nodeName"),
                "phase": pod_status.get("phase"),
                "container_state": state,
                "restart_count": status.get("restartCount"),
            }
        ),
        gpus=pod_grant(pod, container),
    )


def pod_grant(pod: JsonMapping, container: str = CONTAINER) -> Grant | None:
    """The GPUs the cluster gave the container, as the Pod it ran says them (its limits of the
    device plugin's resource), read from the cluster: never the image's own report."""
    for c in _containers(pod):
        if c.get("name") == container:
            limits = obj(path(c, "resources", "limits"))
            count = str(limits.get(GPU_RESOURCE) or "0")
            return Grant("pod_limits", (f"{GPU_RESOURCE}={count}",)) if count != "0" else None
    return None


def key_secret(pod: JsonMapping, container: str = CONTAINER) -> tuple[str, str] | None:
    """The Secret (name, data key) the Pod's event key comes from (`secretKeyRef`), if it does."""
    for c in _containers(pod):
        if c.get("name") != container:
            continue
        for e in objects(c.get("env")):
            ref = path(e, "valueFrom", "secretKeyRef")
            if e.get("name") == EVENT_KEY_ENV and isinstance(ref, dict):
                name, key = text(path(ref, "name")), text(path(ref, "key"))
                return (name, key) if name is not None and key is not None else None
    return None


def event_key(
    pod: JsonMapping, secret: JsonMapping | None = None, container: str = CONTAINER
) -> bytes | None:
    """The run's event key (the runner's side of the channel): from the Secret the Pod's env
    refers to, or from the env itself for a Pod rendered before keys moved into Secrets."""
    ref = key_secret(pod, container)
    if ref is not None:
        if secret is None or path(secret, "metadata", "name") != ref[0]:
            return None
        value = path(secret, "data", ref[1])
        try:
            return bytes.fromhex(base64.b64decode(str(value), validate=True).decode("ascii"))
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
    for c in _containers(pod):
        if c.get("name") != container:
            continue
        for e in objects(c.get("env")):
            value = text(e.get("value"))
            if e.get("name") == EVENT_KEY_ENV and value is not None:
                try:
                    return bytes.fromhex(value)
                except ValueError:
                    return None
    return None


def missing_key(pod: JsonMapping, secret: JsonMapping | None) -> str:
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
    given = path(secret, "metadata", "name")
    if given != name:
        return f"the Secret given is secret/{given}, but the Pod's event key is in secret/{name}"
    return f"secret/{name} holds no hex event key under {ref[1]!r}"


def _command(pod: JsonMapping, container: str) -> str | None:
    for c in _containers(pod):
        command = items(c.get("command"))
        if c.get("name") == container and command:
            return str(command[0])
    return None


def environment(pod: JsonMapping, iid: ImageID | None, container: str = CONTAINER) -> JsonObject:
    status = container_status(pod, container) or {}
    runtime = str(status.get("containerID") or "").partition("://")[0] or None
    meta = obj(pod.get("metadata"))
    owners = [o.get("name") for o in objects(meta.get("ownerReferences")) if o.get("kind") == "Job"]
    # The cluster's own words, copied into the statement as the JSON they are (freeze).
    return {
        "driver": "kube",
        "engine": runtime,  # containerd, cri-o, docker: from the containerID's scheme
        "namespace": freeze(meta.get("namespace")),
        "pod": freeze(meta.get("name")),
        "job": freeze(owners[0]) if owners else None,
        "node": freeze(path(pod, "spec", "nodeName")),
        "image": freeze(status.get("image")),
        "image_id": iid.raw if iid else None,
        "key_isolation": {"method": "pod"},  # signed where `pod collect` runs, never in the cluster
    }


def image_id_stage(
    iid: ImageID | None, expected: Sequence[str], evidence: Sequence[EvidenceFile] = ()
) -> StageResult:
    """Is what the cluster ran the image we meant? Compares the repo digest in imageID (or the
    local image ID, when that is all the runtime reports) with the expected digests."""

    def result(status: Status, detail: str, **data: JsonValue) -> StageResult:
        base: JsonObject = {"image_id": iid.raw if iid else None, "expected": list(expected)}
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


def expected_digests(pod: JsonMapping, given: Sequence[str], container: str = CONTAINER) -> list[str]:
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
        pod: JsonMapping,
        log: bytes,
        *,
        secret: JsonMapping | None = None,
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
        annotated = text(path(self.pod, "metadata", "annotations", BUNDLE_ANNOTATION))
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
            environment=dict[str, object](environment(pod, iid)),
            runs=[ControllerRun(prep.stage_ids, br, events)],
            started=_started(pod),
            driver="kube",
            source=source,
            given=[image_id_stage(iid, self.expected, [pod_file])],
        )


def _started(pod: JsonMapping) -> str:
    started = text(path(pod, "status", "startTime"))
    if started is not None:
        return started
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
