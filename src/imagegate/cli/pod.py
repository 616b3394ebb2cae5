"""Commands: pod render, pod collect, pod run (zero-GPU Pod mode; the logic is in imagegate.kube)."""

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from imagegate.cli import _accept as o
from imagegate.cli import _app
from imagegate.cli._app import Option, app

if TYPE_CHECKING:  # imported where used: `pod --help` loads neither the run nor the cluster's modules
    from imagegate.kube import render
    from imagegate.usecases import runner

pod_app = typer.Typer(
    help="Zero-GPU Pod mode: run the probes in the target cluster, against the image exactly as "
    "that cluster pulled it (its real imageID), without taking a GPU.\n\n"
    "Examples:\n\n  imagegate pod run myorg/vllm:0.11 -p vllm -n accept --node-selector pool=cpu\n\n"
    "  imagegate pod render myorg/vllm:0.11 -p vllm > job.yaml",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(pod_app, name="pod")

_RENDER_EPILOG = (
    "Pitfalls avoided: no GPU resources and NVIDIA_VISIBLE_DEVICES=void unless --gpus N; never preemptionPolicy "
    "(only --priority-class); the bundle is a whole-volume ConfigMap mount found by its stable "
    "path; pick nodes that can run the image with --node-selector and --toleration."
)
_GPUS = Option(
    0,
    "--gpus",
    min=0,
    help="Request nvidia.com/gpu: N and stop hiding GPUs; the run starts with the GPU node check "
    "(pod collect: the N the Pod was rendered with).",
)
_WAIT = Option(
    None,
    "--timeout",
    metavar="SECONDS",
    help="Seconds to wait for the Pod's result (pod run: by default the Job's deadline + 2 minutes; "
    "pod collect: with --job).",
)
# pod collect needs it with --job only (checked where the options are read)
_CONTEXT = _app.KUBE_CONTEXT
_EXPECT_DIGEST = Option(
    [], "--expect-digest", help="The digest the cluster must run (repeatable; default: the pinned digest)."
)
_SOURCE = o.SOURCE


@dataclass(frozen=True)
class PodSpec:
    """What render and run put in the Job (kube.render.PodOptions), and the schemas it must pass."""

    namespace: str = _app.KUBE_NAMESPACE
    name: str | None = Option(
        None,
        "--name",
        help="Name of the Secret, the ConfigMap and the Job (default: from pipeline and image).",
    )
    node_selector: list[str] = Option([], "--node-selector", help="key=value (repeatable).")
    toleration: list[str] = Option([], "--toleration", help="key[=value]:effect (repeatable).")
    priority_class: str | None = Option(
        None, "--priority-class", help="priorityClassName; preemptionPolicy is never set."
    )
    service_account: str | None = Option(None, "--service-account", help="serviceAccountName.")
    image_pull_secret: list[str] = Option(
        [], "--image-pull-secret", help="imagePullSecrets name (repeatable)."
    )
    deadline: str | None = Option(
        None,
        "--deadline",
        help="activeDeadlineSeconds, pull included: 1800, '30m' (default: 30m or the stages' timeouts + 10m).",
    )
    digest: str | None = Option(None, "--digest", help="Pin IMAGE to this manifest digest (sha256:...).")
    python: str | None = Option(
        None, "--python", help="The image's interpreter (default: the pipeline's python:, else python3)."
    )
    run_as_user: int | None = Option(None, "--run-as-user", help="runAsUser (and runAsNonRoot unless 0).")
    kube_version: str = _app.KUBE_VERSION
    gpus: int = _GPUS
    runtime_class: str | None = Option(
        None, "--runtime-class", help="runtimeClassName, e.g. nvidia (GPU nodes)."
    )
    model_pvc: str | None = Option(
        None,
        "--model-pvc",
        metavar="CLAIM[:SUBPATH]",
        help="The serve stages' model: this PersistentVolumeClaim (a sub-path of it), mounted read-only.",
    )
    model_host_path: str | None = Option(
        None,
        "--model-host-path",
        metavar="PATH",
        help="The serve stages' model: a node's folder (hostPath), read-only.",
    )
    startup_budget: str | None = Option(
        None,
        "--startup-budget",
        help="The serve stages' time to readiness, e.g. '35m' (the startupProbe budget); the Job's "
        "activeDeadlineSeconds grows to cover it.",
    )

    def plan_words(self) -> "render.ServeWords":
        """What the model volume and --startup-budget change in the plan."""
        from imagegate.kube import render

        return render.serve_options(self.model_pvc, self.model_host_path, self.startup_budget)

    def render(self, prep: "runner.Prepared", image: str, notify: o.Notify) -> "render.Rendered":
        from imagegate.kube import render

        rendered = render.render_checked(prep, image, **dataclasses.asdict(self))
        for note in rendered.notes:
            notify(f"note: {note}")
        return rendered


def _gpus(n: int) -> str | None:
    return str(n) if n else None  # with GPUs the plan starts with the node check


@pod_app.command(
    "render",
    epilog="Examples:\n\n"
    "  imagegate pod render myorg/vllm:0.11 -p vllm > pod.yaml\n\n"
    "  imagegate pod render myorg/vllm@sha256:<digest> -p vllm -n accept --node-selector pool=h20 "
    "--toleration nvidia.com/gpu:NoSchedule --deadline 40m | kubectl apply -f -\n\n"
    "  imagegate pod render myorg/vllm@sha256:<digest> -p vllm --secret-out key.yaml > job.yaml   "
    "# job.yaml can be committed; apply key.yaml, never commit it\n\n" + _RENDER_EPILOG,
)
@o.grouped
def render_cmd(
    image: str = typer.Argument(
        ..., help="The image the cluster should run, e.g. repo/name:tag or repo@sha256:..."
    ),
    pipeline: str = o.PIPELINE,
    module: list[str] = o.MODULES,
    spec: PodSpec = PodSpec(),
    secret_out: Path | None = Option(
        None,
        "--secret-out",
        metavar="FILE",
        help="Write the Secret (the run's event key) to FILE (new, mode 0600), not stdout: stdout is "
        "then the ConfigMap and the Job alone, the same bytes for the same inputs (for GitOps; their "
        "name is then the same for the same pipeline and image, unless --name).",
    ),
    # Accepted from older scripts and hidden: render signs nothing (collect and run sign).
    key: str | None = Option(None, "--key", hidden=True),
    no_sign: bool = Option(False, "--no-sign", hidden=True),
    quiet: bool = o.QUIET,
) -> None:
    """Print the Secret (the run's event key), the ConfigMap (the bundle) and the Job (YAML) that run PIPELINE against IMAGE in a Pod."""
    from imagegate.kube import render
    from imagegate.usecases import runner

    notify = o.notifier(quiet)
    if secret_out is not None:
        render.check_new_file(secret_out, "--secret-out")
    prep = runner.prepare(
        runner.RunOptions(pipeline=pipeline, modules=module, gpus=_gpus(spec.gpus), **spec.plan_words())
    )
    if secret_out is not None and spec.name is None:  # the same bytes for the same inputs
        spec = dataclasses.replace(spec, name=render.stable_name(prep.plan.pipeline.name, image))
    rendered = spec.render(prep, image, notify)
    notify(
        f"configmap/{rendered.name}: {rendered.configmap_bytes()} bytes; validated against Kubernetes {spec.kube_version}"
    )
    if secret_out is not None:
        render.write_secret(rendered, secret_out)
        notify(f"secret/{rendered.name}: written to {secret_out} (mode 0600); apply it before the Job")
        sys.stdout.write(rendered.yaml([rendered.configmap, rendered.job]))
        return
    sys.stdout.write(rendered.yaml())


@pod_app.command(
    "collect",
    epilog="Examples:\n\n"
    "  kubectl logs job/imagegate-vllm-1a2b3c4d > pod.log; kubectl get pod -l "
    "imagegate/run=imagegate-vllm-1a2b3c4d -o json > pod.json\n\n"
    "  imagegate pod collect --logs pod.log --pod pod.json -p vllm --expect-digest sha256:<digest>\n\n"
    "  imagegate pod collect --job imagegate-vllm-1a2b3c4d -n accept -p vllm\n\n" + o.EXIT_CODES,
)
@o.grouped
def collect_cmd(
    logs: Path | None = Option(None, "--logs", help="The Pod's log (kubectl logs), with --pod."),
    pod: Path | None = Option(None, "--pod", help="The Pod's JSON (kubectl get pod -o json), with --logs."),
    secret: Path | None = Option(
        None,
        "--secret",
        help="The run's event key Secret (kubectl get secret NAME -o json), with --logs and --pod.",
    ),
    job: str | None = Option(
        None, "--job", help="Read the Pod, its log and its key Secret from the cluster, by Job name."
    ),
    namespace: str = _app.KUBE_NAMESPACE,
    context: str | None = _CONTEXT,
    a: o.Accepting = o.Accepting(),
    expect_digest: list[str] = _EXPECT_DIGEST,
    source: str | None = _SOURCE,
    expect_config: str | None = o.EXPECT_CONFIG,
    timeout: float | None = _WAIT,
    gpus: int = _GPUS,
) -> None:
    """Turn a finished Pod's log and status into stage results, the imageID check, evidence and the statement."""
    from imagegate.cli import _checks
    from imagegate.kube import podrun
    from imagegate.kube.collect import PodObserver
    from imagegate.usecases import accept, runner

    notify = o.notifier(a.silent)
    _checks.check_timeout(timeout)
    _checks.check_expect_config(expect_config)
    prep = runner.prepare(a.run_options(gpus=_gpus(gpus), source=source, expect_config=expect_config))
    _checks.check_stage_inputs(prep, expect_config)
    pod_obj, log, key = podrun.finished_pod(logs, pod, job, namespace, context, timeout, notify, secret)
    observer = PodObserver(pod_obj, log, secret=key, expect_digests=expect_digest, notify=notify)
    outputs = a.outputs(observer.reference, notify)
    done = accept.accept(accept.Request(prep, observer, a.out, outputs), notify)
    o.finish(done, a.fmt, a.quiet, outputs.key)


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
@o.grouped
def run_cmd(
    image: str = typer.Argument(..., help="The image the cluster should run."),
    a: o.Accepting = o.Accepting(),
    spec: PodSpec = PodSpec(),
    context: str | None = _CONTEXT,
    expect_digest: list[str] = _EXPECT_DIGEST,
    source: str | None = _SOURCE,
    expect_config: str | None = o.EXPECT_CONFIG,
    keep: bool = Option(
        False,
        "--keep",
        help="Leave the Job, ConfigMap and Secret (ttlSecondsAfterFinished still applies to the Job).",
    ),
    timeout: float | None = _WAIT,
) -> None:
    """Render, create, wait within the deadline, collect and delete: one acceptance run in a Pod."""
    from imagegate.cli import _checks
    from imagegate.kube import kubectl, podrun
    from imagegate.usecases import accept, runner

    notify = o.notifier(a.silent)
    with o.interrupts():
        _checks.check_timeout(timeout)
        _checks.check_expect_config(expect_config)
        prep = runner.prepare(
            a.run_options(
                gpus=_gpus(spec.gpus), source=source, expect_config=expect_config, **spec.plan_words()
            )
        )
        _checks.check_stage_inputs(prep, expect_config)
        outputs = a.outputs(image, notify)
        observer = podrun.PodRunObserver(
            spec.render(prep, image, notify),
            kubectl.KubectlCluster(context=context),
            expect_digests=expect_digest,
            keep=keep,
            limit_s=timeout,
            notify=notify,
        )
        done = accept.accept(accept.Request(prep, observer, a.out, outputs), notify)
    o.finish(done, a.fmt, a.quiet, outputs.key)
