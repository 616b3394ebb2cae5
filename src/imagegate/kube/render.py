"""The Kubernetes objects of one run: a Secret holding the run's event key, a ConfigMap holding
the bundle and a Job that runs it once with the image's own python; zero GPUs unless `--gpus N`.
The pitfall each choice answers: docs/pod.md, "Why the objects are as they are"."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import yaml

from imagegate._support.jsontypes import JsonObject, JsonValue, items, obj, path
from imagegate.domain import protocol
from imagegate.domain import servemodel as modelpath
from imagegate.domain.digest import is_digest
from imagegate.errors import UsageError
from imagegate.oci.reference import check_image
from imagegate.pipeline.spec import parse_duration
from imagegate.usecases.runner import Prepared

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

MOUNT_DIR = "/imagegate/bundle"
BUNDLE_KEY = "imagegate.pyz"
BUNDLE_PATH = f"{MOUNT_DIR}/{BUNDLE_KEY}"
CONTAINER = "probe"
EVENT_KEY_ENV = "IMAGEGATE_EVENT_KEY"  # probes/controller.py reads it
SECRET_KEY = "event-key"  # the Secret's data key holding the hex event key
RUN_LABEL = "imagegate/run"  # on the Pod template: how a run finds its Pods
BUNDLE_ANNOTATION = "imagegate/bundle-sha256"  # collect checks it ran the bundle it was given
PIPELINE_ANNOTATION = "imagegate/pipeline"
MANAGED_BY = {"app.kubernetes.io/managed-by": "imagegate"}
CONFIGMAP_LIMIT = 1024 * 1024  # the API server's limit for a ConfigMap, all of it
DEFAULT_DEADLINE_S = 30 * 60.0  # covers pulling a large image, not only the stages
PULL_ALLOWANCE_S = 10 * 60.0  # activeDeadlineSeconds counts from the Job's start, pull included
DEFAULT_TTL_S = 3600
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The Pod Security Standard levels, the strictest first; the namespace label that enforces one.
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# The user the probes run as unless --run-as-user says otherwise: not root, so that a namespace
# enforcing the `restricted` Pod Security Standard admits the Pod (runAsNonRoot needs a UID the
# kubelet can check, whatever USER the image names). 65532: distroless's `nonroot`, no system
# user's. The probes need no file of their own on the image: they read it, and write /tmp.
NONROOT_UID = 65532

_DUMPER: type[yaml.SafeDumper | yaml.CSafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class PodOptions:
    namespace: str = "default"
    name: str | None = None  # default: derived from the pipeline and the image
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, str]] = ()
    priority_class: str | None = None
    service_account: str | None = None
    image_pull_secrets: Sequence[str] = ()
    deadline_s: float | None = None  # default: DEFAULT_DEADLINE_S, or more if the stages need it
    ttl_s: int = DEFAULT_TTL_S
    digest: str | None = None  # pin IMAGE to this manifest digest
    python: str | None = None  # default: the pipeline's `python:`, else python3
    run_as_user: int | None = None
    cpu_request: str = "250m"
    cpu_limit: str = "2"
    memory_request: str = "512Mi"
    memory_limit: str = "4Gi"
    tmp_size: str = "2Gi"
    gpus: int = 0  # nvidia.com/gpu requested; 0: none, and GPUs hidden
    runtime_class: str | None = None  # e.g. "nvidia" where the GPU runtime is not the default
    model: ModelVolume | None = None  # the serve stages' model, mounted read-only


@dataclass(frozen=True)
class ModelVolume:
    """The model's volume: a PersistentVolumeClaim (and a sub-path in it) or a node's hostPath,
    mounted read-only where the serve stages look for it (modelpath.IN_SANDBOX)."""

    claim: str | None = None
    sub_path: str | None = None
    host_path: str | None = None

    def volume(self) -> JsonObject:
        if self.claim:
            return {"name": "model", "persistentVolumeClaim": {"claimName": self.claim, "readOnly": True}}
        return {"name": "model", "hostPath": {"path": self.host_path, "type": "Directory"}}

    def mount(self) -> JsonObject:
        m: JsonObject = {"name": "model", "mountPath": modelpath.IN_SANDBOX, "readOnly": True}
        return {**m, "subPath": self.sub_path} if self.sub_path else m


def parse_model_volume(pvc: str | None, host_path: str | None) -> ModelVolume | None:
    """--model-pvc CLAIM[:SUBPATH] or --model-host-path PATH (not both), checked."""
    if pvc and host_path:
        raise UsageError("give --model-pvc or --model-host-path, not both")
    if host_path:
        if not host_path.startswith("/") or ".." in host_path.split("/"):
            raise UsageError(f"--model-host-path {host_path!r}: an absolute path on the node, without '..'")
        return ModelVolume(host_path=host_path)
    if not pvc:
        return None
    claim, _, sub = pvc.partition(":")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", claim):
        raise UsageError(
            f"--model-pvc {pvc!r}: {claim!r} is not a claim name",
            hint="CLAIM[:SUBPATH], e.g. models:llama-3-8b (lower-case letters, digits, '-', '.')",
        )
    if sub and (sub.startswith("/") or ".." in sub.split("/")):
        raise UsageError(f"--model-pvc {pvc!r}: the sub-path is relative to the claim, without '..'")
    return ModelVolume(claim=claim, sub_path=sub or None)


@dataclass(frozen=True)
class Rendered:
    name: str
    namespace: str
    image: str  # as it goes into the Pod: pinned by digest when known
    configmap: JsonObject
    job: JsonObject
    secret: JsonObject  # this run's event key: the only object that differs between renders
    notes: tuple[str, ...] = ()  # things the user should know, e.g. an unpinned image

    @property
    def objects(self) -> list[JsonObject]:
        return [self.secret, self.configmap, self.job]  # the Secret first: the Pod needs it to start

    def yaml(self, objects: list[JsonObject] | None = None) -> str:
        # libyaml's emitter where PyYAML has it: the same text, 30x faster (a fleet's render
        # writes the bundle once a node)
        return yaml.dump_all(
            objects or self.objects, Dumper=_DUMPER, sort_keys=False, default_flow_style=False
        )

    @property
    def pod_security(self) -> str:
        """The strictest Pod Security Standard level the Job's Pod meets: `restricted` as
        rendered by default, `baseline` when it runs as root (--run-as-user 0), `privileged`
        with a node's folder mounted (--model-host-path: a hostPath volume)."""
        spec = obj(path(self.job, "spec", "template", "spec"))
        if any(isinstance(v, dict) and "hostPath" in v for v in items(spec.get("volumes"))):
            return "privileged"
        return "baseline" if path(spec, "securityContext", "runAsUser") == 0 else "restricted"

    def configmap_bytes(self) -> int:
        """The ConfigMap as the API server stores it (JSON), which the 1 MiB limit applies to."""
        import json

        return len(json.dumps(self.configmap, separators=(",", ":")).encode())


def check_new_file(path: Path, option: str) -> None:
    """Before any work: a file that exists is never overwritten (it may hold an earlier run's key)."""
    if os.path.lexists(path):
        raise UsageError(
            f"{option} {path}: already exists", hint="name a new file, or remove the old one first"
        )
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: no folder {path.parent}", hint="create the folder first")


def write_secret(rendered: Rendered, path: Path) -> None:
    """The Secret alone, in a new file only its owner reads (O_EXCL: nothing is overwritten)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise UsageError(
            f"--secret-out {path}: {e.strerror}", hint="name a new file in a writable folder"
        ) from e
    with os.fdopen(fd, "w") as f:
        f.write(rendered.yaml([rendered.secret]))


def parse_node_selector(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--node-selector {item!r}: expected key=value", hint="e.g. gpu.pool=h20")
        out[key] = value
    return out


def parse_toleration(text: str) -> dict[str, str]:
    """`key[=value]:effect`, or `key:effect` (operator Exists); `:effect` alone tolerates every
    key with that effect."""
    body, sep, effect = text.rpartition(":")
    if not sep or effect not in EFFECTS:
        raise UsageError(
            f"--toleration {text!r}: expected key[=value]:effect",
            hint=f"effect is one of {', '.join(EFFECTS)}, e.g. nvidia.com/gpu:NoSchedule",
        )
    key, eq, value = body.partition("=")
    if eq:
        if not key:
            raise UsageError(f"--toleration {text!r}: a value needs a key")
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    tol = {"operator": "Exists", "effect": effect}
    return {"key": key, **tol} if key else tol


def parse_deadline(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--deadline {text!r}: {e}") from e


class ServeWords(TypedDict, total=False):
    """runner.RunOptions' words for the serve stages, only those given."""

    model: str
    startup_budget: float


def serve_options(
    model_pvc: str | None, model_host_path: str | None, startup_budget: str | None
) -> ServeWords:
    """What the model volume and --startup-budget change in the plan (runner.RunOptions words):
    the serve stages' model path, their time to readiness (and so the Job's deadline)."""
    out: ServeWords = {}
    if parse_model_volume(model_pvc, model_host_path):
        out["model"] = modelpath.IN_SANDBOX
    if startup_budget:
        try:
            out["startup_budget"] = parse_duration(startup_budget)
        except ValueError as e:
            raise UsageError(f"--startup-budget {startup_budget!r}: {e}") from e
    return out


class PodFields(TypedDict, total=False):
    """The PodOptions fields `options_from_args` takes as they are (the rest it parses)."""

    namespace: str
    name: str | None
    priority_class: str | None
    service_account: str | None
    ttl_s: int
    digest: str | None
    python: str | None
    run_as_user: int | None
    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str
    tmp_size: str
    gpus: int
    runtime_class: str | None


class PodWords(PodFields, total=False):
    """The command line's words for the Pod, as `options_from_args` takes them."""

    node_selector: Sequence[str]
    toleration: Sequence[str]
    deadline: str | None
    image_pull_secret: Sequence[str]
    model_pvc: str | None
    model_host_path: str | None
    startup_budget: str | None


def options_from_args(
    *,
    node_selector: Sequence[str] = (),
    toleration: Sequence[str] = (),
    deadline: str | None = None,
    image_pull_secret: Sequence[str] = (),
    model_pvc: str | None = None,
    model_host_path: str | None = None,
    startup_budget: str | None = None,  # applied to the plan (model_options), not to the Pod
    **kw: Unpack[PodFields],
) -> PodOptions:
    """PodOptions from the command line's words (`--node-selector k=v`, `--toleration
    key[=value]:effect`, `--deadline 30m`); the other fields are taken as they are."""
    return PodOptions(
        node_selector=parse_node_selector(node_selector),
        tolerations=[parse_toleration(t) for t in toleration],
        deadline_s=parse_deadline(deadline) if deadline else None,
        image_pull_secrets=image_pull_secret,
        model=parse_model_volume(model_pvc, model_host_path),
        **kw,
    )


def render_checked(prep: Prepared, image: str, kube_version: str, **words: Unpack[PodWords]) -> Rendered:
    """`render` with PodOptions from the command line's words (options_from_args), the objects
    checked against that Kubernetes version's schemas."""
    from imagegate.kube import validate

    rendered = render(prep, image, options_from_args(**words))
    validate.check(rendered.objects, kube_version)
    return rendered


def default_name(pipeline: str, image: str) -> str:
    """The pipeline and the image, and a part of this render's own: two runs of one image and
    pipeline in one namespace never take each other's names (a Secret is immutable; the second
    apply would fail on it). A re-run under a name chosen with --name finds, and waits out, its
    predecessor."""
    return f"{stable_name(pipeline, image)}-{secrets.token_hex(3)}"


def stable_name(pipeline: str, image: str) -> str:
    """The same for the same pipeline and image: for output that is committed and reviewed
    (`pod render --secret-out`), and the start of every default name."""
    slug = re.sub(r"[^a-z0-9-]+", "-", pipeline.lower()).strip("-")[:24] or "run"
    return f"imagegate-{slug}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


def pinned(image: str, digest: str | None) -> tuple[str, str | None]:
    """IMAGE pinned by digest when known: an `@sha256:` already in it, or --digest."""
    if digest is not None and not is_digest(digest):
        raise UsageError(f"--digest {digest!r}: expected sha256:<64 hex digits>")
    name, at, present = image.partition("@")
    if at:
        if not is_digest(present):
            raise UsageError(f"image {image!r}: the digest after @ is not sha256:<64 hex digits>")
        if digest and digest != present:
            raise UsageError(f"image {image!r} is pinned to {present}, but --digest says {digest}")
        return image, present
    if digest:
        return f"{name}@{digest}", digest
    return image, None


def job_deadline(prep: Prepared, given: float | None) -> int:
    if given is not None:
        return max(1, round(given))
    return round(max(DEFAULT_DEADLINE_S, prep.deadline() + PULL_ALLOWANCE_S))


def render(prep: Prepared, image: str, opts: PodOptions) -> Rendered:
    # The kubelet pulls what the Pod names: a reference, never a local image ID.
    check_image(image, engine_id=False)
    if not prep.inside.stages:
        raise UsageError(
            f"pipeline {prep.plan.pipeline.name!r} has no in-image stage: nothing to run in a Pod",
            hint="run its outside stages with `imagegate run`",
        )
    name = opts.name or default_name(prep.plan.pipeline.name, image)
    if len(name) > 52 or not _DNS_LABEL.match(name):
        # Job names become Pod names with a suffix and a label value (63 characters at most).
        raise UsageError(f"--name {name!r}: lower-case letters, digits and '-', at most 52 characters")
    ref, digest = pinned(image, opts.digest)
    notes: list[str] = []
    if digest is None:
        notes.append(
            f"{image} is not pinned by digest: the cluster pulls whatever the tag points to now; "
            "collect still records the imageID it ran (give --digest to pin it)"
        )
    if opts.run_as_user == 0:
        notes.append(
            "--run-as-user 0: the probes run as root, which Pod Security `restricted` refuses; the "
            "namespace must enforce `baseline` or `privileged`"
        )
    deadline = job_deadline(prep, opts.deadline_s)
    if opts.deadline_s is not None and opts.deadline_s < prep.deadline():
        notes.append(
            f"--deadline {opts.deadline_s:g}s is shorter than the stages' timeouts added up "
            f"({prep.deadline():g}s), before the image pull: the Job may be stopped mid-run"
        )
    configmap, secret = _bundle_and_key(prep, name, opts.namespace)
    labels = {**MANAGED_BY, RUN_LABEL: name}
    python = opts.python or prep.loaded.pipeline.python or "python3"
    job: JsonObject = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": dict(labels)},
        "spec": {
            "backoffLimit": 0,  # a failed probe run is evidence, not something to retry
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": opts.ttl_s,
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": {
                        BUNDLE_ANNOTATION: prep.bundle.sha256,
                        PIPELINE_ANNOTATION: prep.plan.pipeline.name,
                    },
                },
                "spec": _pod_spec(ref, python, name, opts),
            },
        },
    }
    return Rendered(name, opts.namespace, ref, configmap, job, secret, tuple(notes))


@functools.lru_cache(maxsize=4)
def _encoded(bundle: bytes) -> str:
    """The bundle as a ConfigMap holds it, encoded once: a fleet's Jobs (one per node, a bundle
    per GPU count) share the one string, so memory does not grow with the nodes."""
    return base64.b64encode(bundle).decode("ascii")


def _bundle_and_key(prep: Prepared, name: str, namespace: str) -> tuple[JsonObject, JsonObject]:
    """The ConfigMap holding the probes' bundle and the Secret holding the run's protocol key."""
    labels = {**MANAGED_BY, RUN_LABEL: name}
    configmap: JsonObject = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        # Immutable: nobody can swap the bundle under a running Pod (the controller survives it
        # anyway), and the kubelet need not watch it.
        "immutable": True,
        "binaryData": {BUNDLE_KEY: _encoded(prep.bundle.data)},
    }
    secret: JsonObject = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "immutable": True,
        "data": {SECRET_KEY: base64.b64encode(protocol.new_key().hex().encode()).decode("ascii")},
    }
    return configmap, secret


def _pod_spec(image: str, python: str, name: str, opts: PodOptions) -> JsonObject:
    uid = NONROOT_UID if opts.run_as_user is None else opts.run_as_user
    pod_security: JsonObject = {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": uid,
        "runAsNonRoot": uid != 0,
    }
    spec: JsonObject = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # the probes never talk to the API server
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "containers": [_container(image, python, name, opts)],
        "volumes": [
            {"name": "bundle", "configMap": {"name": name, "defaultMode": 0o444}},
            {"name": "tmp", "emptyDir": {"sizeLimit": opts.tmp_size}},
            *([opts.model.volume()] if opts.model else []),
        ],
    }
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.runtime_class:
        spec["runtimeClassName"] = opts.runtime_class
    if opts.priority_class:
        spec["priorityClassName"] = opts.priority_class
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    return spec


def _container(image: str, python: str, name: str, opts: PodOptions) -> JsonObject:
    hidden_gpus: list[JsonValue] = (
        []  # the device plugin says which GPUs; hiding them would undo the request
        if opts.gpus
        else [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
            {"name": "CUDA_VISIBLE_DEVICES", "value": ""},
        ]
    )
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        # The image's own interpreter, no shell: images without /bin/sh still run. -I -S: the
        # controller never runs the image's site hooks (.pth, sitecustomize, PYTHONPATH).
        "command": [python, "-I", "-S", BUNDLE_PATH],
        "env": [
            # This run's event key, from its Secret (the Job holds only the reference): the
            # controller takes it out of its environment before any stage starts, and no stage
            # can read the controller's (non-dumpable) environ.
            {"name": EVENT_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": SECRET_KEY}}},
            *hidden_gpus,
            {"name": "TMPDIR", "value": "/tmp"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},  # events reach the log as they happen
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "resources": {
            "requests": {"cpu": opts.cpu_request, "memory": opts.memory_request},
            # Extended resources are requested by their limit alone (the request defaults to it).
            "limits": {
                "cpu": opts.cpu_limit,
                "memory": opts.memory_limit,
                **({GPU_RESOURCE: str(opts.gpus)} if opts.gpus else {}),
            },
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "bundle", "mountPath": MOUNT_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            *([opts.model.mount()] if opts.model else []),
        ],
    }
