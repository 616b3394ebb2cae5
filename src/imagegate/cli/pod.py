"""Commands: pod render, pod collect, pod run (zero-GPU Pod mode; the logic is in imagegate.kube)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from imagegate import runner
from imagegate.accept import accept
from imagegate.cli import _accept as o
from imagegate.cli._app import Format, app
from imagegate.errors import UsageError
from imagegate.kube import kubectl
from imagegate.kube.podrun import PodRunObserver

pod_app = typer.Typer(
    help="Zero-GPU Pod mode: run the probes in the target cluster, against the image exactly as "
    "that cluster pulled it (its real imageID), without taking a GPU.\n\n"
    "Examples:\n\n  imagegate pod run myorg/vllm:0.11 -p vllm -n accept --node-selector pool=cpu\n\n"
    "  imagegate pod render myorg/vllm:0.11 -p vllm > job.yaml",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(pod_app, name="pod")

# Options render and run share, as typer parameters (typer has no parameter groups).
_RENDER_EPILOG = (
    "Pitfalls avoided: no GPU resources and NVIDIA_VISIBLE_DEVICES=void unless --gpus N; never preemptionPolicy "
    "(only --priority-class); the bundle is a whole-volume ConfigMap mount found by its stable "
    "path; pick nodes that can run the image with --node-selector and --toleration."
)
_NAMESPACE = o.opt("default", "--namespace", "-n", help="Namespace of the ConfigMap and the Job.")
_NAME = o.opt(None, "--name", help="Name of the ConfigMap and the Job (default: from pipeline and image).")
_NODE_SELECTOR = o.opt([], "--node-selector", help="key=value (repeatable).")
_TOLERATION = o.opt([], "--toleration", help="key[=value]:effect (repeatable).")
_PRIORITY = o.opt(None, "--priority-class", help="priorityClassName; preemptionPolicy is never set.")
_ACCOUNT = o.opt(None, "--service-account", help="serviceAccountName.")
_PULL_SECRET = o.opt([], "--image-pull-secret", help="imagePullSecrets name (repeatable).")
_DEADLINE = o.opt(
    None,
    "--deadline",
    help="activeDeadlineSeconds, pull included: 1800, '30m' (default: 30m or the stages' timeouts + 10m).",
)
_DIGEST = o.opt(None, "--digest", help="Pin IMAGE to this manifest digest (sha256:...).")
_PYTHON = o.opt(
    None, "--python", help="The image's interpreter (default: the pipeline's python:, else python3)."
)
_RUN_AS = o.opt(None, "--run-as-user", help="runAsUser (and runAsNonRoot unless 0).")
_KUBE_VERSION = o.opt("1.30", "--kube-version", help="Validate against this Kubernetes version's schemas.")
_GPUS = o.opt(
    0,
    "--gpus",
    min=0,
    help="Request nvidia.com/gpu: N and stop hiding GPUs; the run starts with the GPU node check.",
)
_RUNTIME_CLASS = o.opt(None, "--runtime-class", help="runtimeClassName, e.g. nvidia (GPU nodes).")
_EXPECT_DIGEST = o.opt(
    [], "--expect-digest", help="The digest the cluster must run (repeatable; default: the pinned digest)."
)
_SOURCE = o.opt(
    None,
    "--source",
    help="For outside stages: read the image from this transport (default: the imageID's digest).",
)
_EXPECT_CONFIG = o.opt(None, "--expect-config", help="For the layers stage: the official config digest.")
_CONTEXT = o.opt(None, "--context", help="kubectl context.")
_KEEP = o.opt(False, "--keep", help="Leave the Job and ConfigMap (ttlSecondsAfterFinished still applies).")
_RUN_TIMEOUT = o.opt(
    None, "--timeout", help="Seconds to wait for the Pod's result (default: the Job's deadline + 2 minutes)."
)


def _prepare(
    pipeline: str,
    module: list[str],
    gpus: int,
    advisory_db: Path | None = None,
    source: str | None = None,
    expect_config: str | None = None,
    out: Path = Path("imagegate-runs"),
) -> runner.Prepared:
    """With GPUs the plan starts with the node check (render, run and collect build one plan)."""
    opts = runner.RunOptions(
        pipeline=pipeline, modules=module, out=out, gpus=str(gpus) if gpus else None,
        advisory_db=advisory_db, source=source, expect_config=expect_config,
    )  # fmt: skip
    return runner.prepare(opts)


def _render(prep: runner.Prepared, image: str, kube_version: str, notify: o.Notify, **kw: Any) -> Any:
    from imagegate.kube import render, validate

    rendered = render.render(prep, image, render.options_from_args(**kw))
    validate.check(rendered.objects, kube_version)
    for note in rendered.notes:
        notify(f"note: {note}")
    return rendered


@pod_app.command(
    "render",
    epilog="Examples:\n\n"
    "  imagegate pod render myorg/vllm:0.11 -p vllm > pod.yaml\n\n"
    "  imagegate pod render myorg/vllm@sha256:<digest> -p vllm -n accept --node-selector pool=h20 "
    "--toleration nvidia.com/gpu:NoSchedule --deadline 40m | kubectl apply -f -\n\n" + _RENDER_EPILOG,
)
def render_cmd(
    image: str = typer.Argument(
        ..., help="The image the cluster should run, e.g. repo/name:tag or repo@sha256:..."
    ),
    pipeline: str = o.PIPELINE,
    module: list[str] = o.MODULES,
    namespace: str = _NAMESPACE,
    name: str = _NAME,
    node_selector: list[str] = _NODE_SELECTOR,
    toleration: list[str] = _TOLERATION,
    priority_class: str = _PRIORITY,
    service_account: str = _ACCOUNT,
    image_pull_secret: list[str] = _PULL_SECRET,
    deadline: str = _DEADLINE,
    digest: str = _DIGEST,
    python: str = _PYTHON,
    run_as_user: int = _RUN_AS,
    kube_version: str = _KUBE_VERSION,
    gpus: int = _GPUS,
    runtime_class: str = _RUNTIME_CLASS,
    key: str = o.KEY,
    no_sign: bool = o.NO_SIGN,
    quiet: bool = o.QUIET,
) -> None:
    """Print the ConfigMap (the bundle) and the Job (YAML) that run PIPELINE against IMAGE in a Pod."""
    notify = o.notifier(quiet)
    prep = _prepare(pipeline, module, gpus)
    rendered = _render(
        prep, image, kube_version, notify, namespace=namespace, name=name, node_selector=node_selector,
        toleration=toleration, priority_class=priority_class, service_account=service_account,
        image_pull_secret=image_pull_secret, deadline=deadline, digest=digest, python=python,
        run_as_user=run_as_user, gpus=gpus, runtime_class=runtime_class,
    )  # fmt: skip
    notify(
        f"configmap/{rendered.name}: {rendered.configmap_bytes()} bytes; validated against Kubernetes {kube_version}"
    )
    sys.stdout.write(rendered.yaml())


@pod_app.command(
    "collect",
    epilog="Examples:\n\n"
    "  kubectl logs job/imagegate-vllm-1a2b3c4d > pod.log; kubectl get pod -l "
    "imagegate/run=imagegate-vllm-1a2b3c4d -o json > pod.json\n\n"
    "  imagegate pod collect --logs pod.log --pod pod.json -p vllm --expect-digest sha256:<digest>\n\n"
    "  imagegate pod collect --job imagegate-vllm-1a2b3c4d -n accept -p vllm\n\n" + o.EXIT_CODES,
)
def collect_cmd(
    logs: Path = o.opt(None, "--logs", help="The Pod's log (kubectl logs), with --pod."),
    pod: Path = o.opt(None, "--pod", help="The Pod's JSON (kubectl get pod -o json), with --logs."),
    job: str = o.opt(None, "--job", help="Read the Pod and its log from the cluster, by Job name."),
    namespace: str = _NAMESPACE,
    context: str = o.opt(None, "--context", help="kubectl context, with --job."),
    pipeline: str = o.PIPELINE,
    module: list[str] = o.MODULES,
    expect_digest: list[str] = _EXPECT_DIGEST,
    out: Path = o.OUT,
    source: str = _SOURCE,
    expect_config: str = _EXPECT_CONFIG,
    fmt: Format = o.FMT,
    require_complete: bool = o.REQUIRE_COMPLETE,
    timeout: float = o.opt(
        None, "--timeout", help="With --job: wait up to this many seconds for its Pod to finish first."
    ),
    report: list[str] = o.REPORT,
    advisory_db: Path = o.ADVISORY_DB,
    key: str = o.KEY,
    no_sign: bool = o.NO_SIGN,
    attach: bool = o.opt(
        False, "--attach", help="Push the signed attestation to the repository of the image the Pod ran."
    ),
    insecure: bool = o.INSECURE,
    gpus: int = o.opt(0, "--gpus", min=0, help="The --gpus N the Pod was rendered with."),
    quiet: bool = o.QUIET,
) -> None:
    """Turn a finished Pod's log and status into stage results, the imageID check, evidence and the statement."""
    notify = o.notifier(quiet or fmt is Format.json)
    from imagegate.kube.collect import PodObserver, read_pod_files

    files = logs is not None or pod is not None
    if files == (job is not None) or (files and (logs is None or pod is None)):
        raise UsageError("give either --logs FILE --pod FILE, or --job NAME")
    if timeout is not None and job is None:
        raise UsageError("--timeout goes with --job", hint="a Pod given as files has finished already")
    o.check_timeout(timeout)
    prep = _prepare(pipeline, module, gpus, advisory_db, source, expect_config, out)
    if job:
        pod_obj, log = _from_cluster(job, namespace, context, timeout, notify)
    else:
        assert pod is not None and logs is not None
        pod_obj, log = read_pod_files(pod, logs)
    observer = PodObserver(pod_obj, log, expect_digests=expect_digest, notify=notify)
    outputs = o.outputs(
        reports=report, fmt=fmt, key=key, no_sign=no_sign, notify=notify,
        attach=attach, insecure=insecure, reference=observer.reference,
    )  # fmt: skip
    done = accept(prep, observer, out, outputs, notify)
    raise o.finish(done, fmt, require_complete, quiet)


def _from_cluster(
    job: str, namespace: str, context: str | None, wait_s: float | None, notify: o.Notify
) -> tuple[dict[str, Any], bytes]:
    from imagegate.kube.kubectl import KubectlCluster
    from imagegate.kube.podrun import pod_and_log

    return pod_and_log(KubectlCluster(context=context), job, namespace, wait_s, notify=notify)


@pod_app.command(
    "run",
    epilog="Examples:\n\n"
    "  imagegate pod run myorg/vllm@sha256:<digest> -p vllm -n accept --node-selector pool=h20\n\n"
    "  imagegate pod run myorg/vllm:0.11 --digest sha256:<digest> -p vllm --toleration "
    "nvidia.com/gpu:NoSchedule --priority-class batch-low --keep\n\n"
    + _RENDER_EPILOG
    + "\n\n"
    + o.EXIT_CODES,
)
def run_cmd(
    image: str = typer.Argument(..., help="The image the cluster should run."),
    pipeline: str = o.PIPELINE,
    module: list[str] = o.MODULES,
    namespace: str = _NAMESPACE,
    name: str = _NAME,
    node_selector: list[str] = _NODE_SELECTOR,
    toleration: list[str] = _TOLERATION,
    priority_class: str = _PRIORITY,
    service_account: str = _ACCOUNT,
    image_pull_secret: list[str] = _PULL_SECRET,
    deadline: str = _DEADLINE,
    digest: str = _DIGEST,
    python: str = _PYTHON,
    run_as_user: int = _RUN_AS,
    kube_version: str = _KUBE_VERSION,
    gpus: int = _GPUS,
    runtime_class: str = _RUNTIME_CLASS,
    context: str = _CONTEXT,
    expect_digest: list[str] = _EXPECT_DIGEST,
    out: Path = o.OUT,
    source: str = _SOURCE,
    expect_config: str = _EXPECT_CONFIG,
    keep: bool = _KEEP,
    fmt: Format = o.FMT,
    require_complete: bool = o.REQUIRE_COMPLETE,
    timeout: float = _RUN_TIMEOUT,
    report: list[str] = o.REPORT,
    advisory_db: Path = o.ADVISORY_DB,
    key: str = o.KEY,
    no_sign: bool = o.NO_SIGN,
    attach: bool = o.ATTACH,
    insecure: bool = o.INSECURE,
    quiet: bool = o.QUIET,
) -> None:
    """Render, create, wait within the deadline, collect and delete: one acceptance run in a Pod."""
    notify = o.notifier(quiet or fmt is Format.json)
    try:
        o.check_timeout(timeout)
        outputs = o.outputs(
            reports=report, fmt=fmt, key=key, no_sign=no_sign, notify=notify,
            attach=attach, insecure=insecure, reference=image,
        )  # fmt: skip
        prep = _prepare(pipeline, module, gpus, advisory_db, source, expect_config, out)
        rendered = _render(
            prep, image, kube_version, notify, namespace=namespace, name=name, node_selector=node_selector,
            toleration=toleration, priority_class=priority_class, service_account=service_account,
            image_pull_secret=image_pull_secret, deadline=deadline, digest=digest, python=python,
            run_as_user=run_as_user, gpus=gpus, runtime_class=runtime_class,
        )  # fmt: skip
        observer = PodRunObserver(
            rendered, kubectl.KubectlCluster(context=context), expect_digests=expect_digest, keep=keep,
            limit_s=timeout, notify=notify,
        )  # fmt: skip
        done = accept(prep, observer, out, outputs, notify)
    except KeyboardInterrupt:
        print("imagegate: interrupted; the Job may still be there (ttlSecondsAfterFinished)", file=sys.stderr)
        raise typer.Exit(130) from None
    raise o.finish(done, fmt, require_complete, quiet)
