"""Commands: pod render, pod collect, pod run (zero-GPU Pod mode; the logic is in imagegate.kube)."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from imagegate import runner
from imagegate.cli import _sign
from imagegate.cli._app import app
from imagegate.errors import UsageError
from imagegate.model import RunRecord, exit_code
from imagegate.report import console as console_report

pod_app = typer.Typer(
    help="Zero-GPU Pod mode: run the probes in the target cluster, against the image exactly as "
    "that cluster pulled it (its real imageID), without taking a GPU.\n\n"
    "Examples:\n\n  imagegate pod run myorg/vllm:0.11 -p vllm -n accept --node-selector pool=cpu\n\n"
    "  imagegate pod render myorg/vllm:0.11 -p vllm > job.yaml",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(pod_app, name="pod")

EXIT_CODES = (
    "Exit codes: 0 accepted (PASS, or a deferred verdict), 1 rejected (FAIL, or deferred with "
    "--require-complete), 2 could not decide (ERROR), 3 usage or input error."
)


class Format(str, enum.Enum):
    table = "table"
    json = "json"


def _pipeline() -> Any:
    return typer.Option(
        "python",
        "--pipeline",
        "-p",
        help="Built-in name (python, vllm, sglang, sglang-disagg) or a YAML file.",
    )


def _modules() -> Any:
    return typer.Option([], "--module", "-m", help="Module for the find_spec stage (repeatable).")


def _namespace() -> Any:
    return typer.Option("default", "--namespace", "-n", help="Namespace of the ConfigMap and the Job.")


def _name() -> Any:
    return typer.Option(
        None, "--name", help="Name of the ConfigMap and the Job (default: from pipeline and image)."
    )


def _node_selector() -> Any:
    return typer.Option([], "--node-selector", help="key=value (repeatable).")


def _toleration() -> Any:
    return typer.Option([], "--toleration", help="key[=value]:effect (repeatable).")


def _priority_class() -> Any:
    return typer.Option(None, "--priority-class", help="priorityClassName; preemptionPolicy is never set.")


def _service_account() -> Any:
    return typer.Option(None, "--service-account", help="serviceAccountName.")


def _pull_secret() -> Any:
    return typer.Option([], "--image-pull-secret", help="imagePullSecrets name (repeatable).")


def _deadline() -> Any:
    return typer.Option(
        None,
        "--deadline",
        help="activeDeadlineSeconds, pull included: 1800, '30m' (default: 30m or the stages' timeouts + 10m).",
    )


def _digest() -> Any:
    return typer.Option(None, "--digest", help="Pin IMAGE to this manifest digest (sha256:...).")


def _python() -> Any:
    return typer.Option(
        None, "--python", help="The image's interpreter (default: the pipeline's python:, else python3)."
    )


def _run_as_user() -> Any:
    return typer.Option(None, "--run-as-user", help="runAsUser (and runAsNonRoot unless 0).")


def _kube_version() -> Any:
    return typer.Option("1.30", "--kube-version", help="Validate against this Kubernetes version's schemas.")


def _expect_digest() -> Any:
    return typer.Option(
        [],
        "--expect-digest",
        help="The digest the cluster must run (repeatable; default: the pinned digest).",
    )


def _out() -> Any:
    return typer.Option(
        Path("imagegate-runs"), "--out", "-o", help="Evidence folder; each run adds a new attempt."
    )


def _source() -> Any:
    return typer.Option(
        None,
        "--source",
        help="For outside stages: read the image from this transport (default: the imageID's digest).",
    )


def _expect_config() -> Any:
    return typer.Option(None, "--expect-config", help="For the layers stage: the official config digest.")


def _format() -> Any:
    return typer.Option(Format.table, "--format", help="table, or json: the in-toto statement on stdout.")


def _require_complete() -> Any:
    return typer.Option(False, "--require-complete", help="A deferred verdict exits 1.")


def _gpus() -> Any:
    return typer.Option(
        0,
        "--gpus",
        min=0,
        help="Request nvidia.com/gpu: N and stop hiding GPUs; the run starts with the GPU node check.",
    )


def _runtime_class() -> Any:
    return typer.Option(None, "--runtime-class", help="runtimeClassName, e.g. nvidia (GPU nodes).")


def _quiet() -> Any:
    return typer.Option(False, "--quiet", "-q", help="No progress messages on stderr.")


def _notifier(quiet: bool) -> runner.Notify:
    err = Console(stderr=True)
    return (
        (lambda _m: None)
        if quiet
        else (lambda m: err.print(f"[dim]imagegate: {m}[/dim]", soft_wrap=True, highlight=False))
    )


def _conclude(record: RunRecord, fmt: Format, require_complete: bool) -> typer.Exit:
    if fmt is Format.json:
        # The statement as written beside the evidence (and signed), byte for byte.
        sys.stdout.write((Path(record.attempt_dir) / "statement.json").read_text())
    else:
        console_report.render(record, console_report.make_console())
    return typer.Exit(exit_code(record.verdict, require_complete=require_complete))


def _render(
    image: str,
    pipeline: str,
    module: list[str],
    namespace: str,
    name: str | None,
    node_selector: list[str],
    toleration: list[str],
    priority_class: str | None,
    service_account: str | None,
    image_pull_secret: list[str],
    deadline: str | None,
    digest: str | None,
    python: str | None,
    run_as_user: int | None,
    kube_version: str,
    gpus: int = 0,
    runtime_class: str | None = None,
) -> tuple[runner.Prepared, Any]:
    from imagegate.kube import render, validate

    prep = runner.prepare(runner.RunOptions(pipeline=pipeline, modules=module, extra=_gpu_extra(gpus)))
    opts = render.PodOptions(
        namespace=namespace,
        name=name,
        node_selector=render.parse_node_selector(node_selector),
        tolerations=[render.parse_toleration(t) for t in toleration],
        priority_class=priority_class,
        service_account=service_account,
        image_pull_secrets=image_pull_secret,
        deadline_s=render.parse_deadline(deadline) if deadline else None,
        digest=digest,
        python=python,
        run_as_user=run_as_user,
        gpus=gpus,
        runtime_class=runtime_class,
    )
    rendered = render.render(prep, image, opts)
    problems = validate.validate(rendered.objects, kube_version)
    if problems:
        raise UsageError(
            f"the rendered objects do not validate against Kubernetes {kube_version}: " + "; ".join(problems),
            hint="check the values given to --name, --node-selector, --toleration",
        )
    return prep, rendered


def _gpu_extra(gpus: int) -> dict[str, Any]:
    """With GPUs the plan starts with the node check (render, run and collect build one plan)."""
    return {"gpus": str(gpus)} if gpus else {}


# Options render and run share, as typer parameters (typer has no parameter groups).
_RENDER_EPILOG = (
    "Pitfalls avoided: no GPU resources and NVIDIA_VISIBLE_DEVICES=void unless --gpus N; never preemptionPolicy "
    "(only --priority-class); the bundle is a whole-volume ConfigMap mount found by its stable "
    "path; pick nodes that can run the image with --node-selector and --toleration."
)


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
    pipeline: str = _pipeline(),
    module: list[str] = _modules(),
    namespace: str = _namespace(),
    name: str = _name(),
    node_selector: list[str] = _node_selector(),
    toleration: list[str] = _toleration(),
    priority_class: str = _priority_class(),
    service_account: str = _service_account(),
    image_pull_secret: list[str] = _pull_secret(),
    deadline: str = _deadline(),
    digest: str = _digest(),
    python: str = _python(),
    run_as_user: int = _run_as_user(),
    kube_version: str = _kube_version(),
    gpus: int = _gpus(),
    runtime_class: str = _runtime_class(),
    key: str = _sign.key_option(),
    no_sign: bool = _sign.no_sign_option(),
    quiet: bool = _quiet(),
) -> None:
    """Print the ConfigMap (the bundle) and the Job (YAML) that run PIPELINE against IMAGE in a Pod."""
    notify = _notifier(quiet)
    _, rendered = _render(
        image, pipeline, module, namespace, name, node_selector, toleration, priority_class,
        service_account, image_pull_secret, deadline, digest, python, run_as_user, kube_version,
        gpus, runtime_class,
    )  # fmt: skip
    for note in rendered.notes:
        notify(f"note: {note}")
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
    "  imagegate pod collect --job imagegate-vllm-1a2b3c4d -n accept -p vllm\n\n" + EXIT_CODES,
)
def collect_cmd(
    logs: Path = typer.Option(None, "--logs", help="The Pod's log (kubectl logs), with --pod."),
    pod: Path = typer.Option(None, "--pod", help="The Pod's JSON (kubectl get pod -o json), with --logs."),
    job: str = typer.Option(None, "--job", help="Read the Pod and its log from the cluster, by Job name."),
    namespace: str = _namespace(),
    context: str = typer.Option(None, "--context", help="kubectl context, with --job."),
    pipeline: str = _pipeline(),
    module: list[str] = _modules(),
    expect_digest: list[str] = _expect_digest(),
    out: Path = _out(),
    source: str = _source(),
    expect_config: str = _expect_config(),
    fmt: Format = _format(),
    require_complete: bool = _require_complete(),
    key: str = _sign.key_option(),
    no_sign: bool = _sign.no_sign_option(),
    gpus: int = typer.Option(0, "--gpus", min=0, help="The --gpus N the Pod was rendered with."),
    quiet: bool = _quiet(),
) -> None:
    """Turn a finished Pod's log and status into stage results, the imageID check, evidence and the statement."""
    notify = _notifier(quiet or fmt is Format.json)
    from imagegate.kube import collect

    signing_key = _sign.resolve(key, no_sign, notify)
    files = logs is not None or pod is not None
    if files == (job is not None) or (files and (logs is None or pod is None)):
        raise UsageError("give either --logs FILE --pod FILE, or --job NAME")
    prep = runner.prepare(runner.RunOptions(pipeline=pipeline, modules=module, extra=_gpu_extra(gpus)))
    opts = runner.RunOptions(
        pipeline=pipeline, modules=module, out=out, source=source, expect_config=expect_config
    )
    if job is not None:
        pod_obj, log = _from_cluster(job, namespace, context)
    else:
        assert logs is not None and pod is not None
        pod_obj, log = _from_files(pod, logs)
    record = collect.collect(prep, pod_obj, log, opts, expect_digests=expect_digest, notify=notify)
    _sign.sign(record, signing_key, notify)
    raise _conclude(record, fmt, require_complete)


def _from_files(pod: Path, logs: Path) -> tuple[dict[str, Any], bytes]:
    from imagegate.kube.collect import pod_from_json

    try:
        data = json.loads(pod.read_text())
        log = logs.read_bytes()
    except OSError as e:
        raise UsageError(f"{e.filename}: {e.strerror}") from e
    except ValueError as e:
        raise UsageError(f"{pod}: not JSON ({e})", hint="kubectl get pod NAME -o json > pod.json") from e
    return pod_from_json(data), log


def _from_cluster(job: str, namespace: str, context: str | None) -> tuple[dict[str, Any], bytes]:
    from imagegate.kube.kubectl import KubectlCluster
    from imagegate.kube.podrun import pod_and_log

    return pod_and_log(KubectlCluster(context=context), job, namespace)


@pod_app.command(
    "run",
    epilog="Examples:\n\n"
    "  imagegate pod run myorg/vllm@sha256:<digest> -p vllm -n accept --node-selector pool=h20\n\n"
    "  imagegate pod run myorg/vllm:0.11 --digest sha256:<digest> -p vllm --toleration "
    "nvidia.com/gpu:NoSchedule --priority-class batch-low --keep\n\n" + _RENDER_EPILOG + "\n\n" + EXIT_CODES,
)
def run_cmd(
    image: str = typer.Argument(..., help="The image the cluster should run."),
    pipeline: str = _pipeline(),
    module: list[str] = _modules(),
    namespace: str = _namespace(),
    name: str = _name(),
    node_selector: list[str] = _node_selector(),
    toleration: list[str] = _toleration(),
    priority_class: str = _priority_class(),
    service_account: str = _service_account(),
    image_pull_secret: list[str] = _pull_secret(),
    deadline: str = _deadline(),
    digest: str = _digest(),
    python: str = _python(),
    run_as_user: int = _run_as_user(),
    kube_version: str = _kube_version(),
    gpus: int = _gpus(),
    runtime_class: str = _runtime_class(),
    context: str = typer.Option(None, "--context", help="kubectl context."),
    expect_digest: list[str] = _expect_digest(),
    out: Path = _out(),
    source: str = _source(),
    expect_config: str = _expect_config(),
    keep: bool = typer.Option(
        False, "--keep", help="Leave the Job and ConfigMap (ttlSecondsAfterFinished still applies)."
    ),
    fmt: Format = _format(),
    require_complete: bool = _require_complete(),
    key: str = _sign.key_option(),
    no_sign: bool = _sign.no_sign_option(),
    quiet: bool = _quiet(),
) -> None:
    """Render, create, wait within the deadline, collect and delete: one acceptance run in a Pod."""
    notify = _notifier(quiet or fmt is Format.json)
    try:
        from imagegate.kube.kubectl import KubectlCluster
        from imagegate.kube.podrun import run_pod

        signing_key = _sign.resolve(key, no_sign, notify)
        prep, rendered = _render(
            image, pipeline, module, namespace, name, node_selector, toleration, priority_class,
            service_account, image_pull_secret, deadline, digest, python, run_as_user, kube_version,
            gpus, runtime_class,
        )  # fmt: skip
        for note in rendered.notes:
            notify(f"note: {note}")
        opts = runner.RunOptions(
            pipeline=pipeline, modules=module, out=out, source=source, expect_config=expect_config
        )
        cluster = KubectlCluster(context=context)
        record = run_pod(
            prep, rendered, cluster, opts, expect_digests=expect_digest, keep=keep, notify=notify
        )
        _sign.sign(record, signing_key, notify)
    except KeyboardInterrupt:
        print("imagegate: interrupted; the Job may still be there (ttlSecondsAfterFinished)", file=sys.stderr)
        raise typer.Exit(130) from None
    raise _conclude(record, fmt, require_complete)
