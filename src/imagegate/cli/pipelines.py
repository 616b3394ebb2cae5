"""Commands: pipelines list / show / schema."""

import typer

from imagegate.cli import _app
from imagegate.cli._app import FORMAT, Format, app

pipelines_app = typer.Typer(
    help="Built-in pipelines and the pipeline file format.\n\n"
    "Examples:\n\n  imagegate pipelines list\n\n  imagegate pipelines show vllm\n\n"
    "  imagegate pipelines schema > pipeline.schema.json",
    no_args_is_help=True,
)
app.add_typer(pipelines_app, name="pipelines")


@pipelines_app.command("list")
def list_(fmt: Format = FORMAT) -> None:
    """List the built-in pipelines: their stages and verdicts (use the name with `run -p NAME`).

    Example: imagegate pipelines list --format json
    """
    from imagegate import pipeline  # here, not above: `--help` never loads the pipeline models
    from imagegate.report import console_pipelines as view

    loaded = [pipeline.load(name) for name in pipeline.builtin_names()]
    if fmt is Format.json:
        _app.show(fmt, lambda: view.document(loaded), lambda _c: None)
        return
    typer.echo("\n".join(view.lines(loaded)))


@pipelines_app.command("show")
def show(name: str = typer.Argument(..., help="A built-in name or a pipeline file.")) -> None:
    """Print a pipeline's YAML after validating it.

    Example: imagegate pipelines show vllm
    """
    from imagegate import pipeline

    loaded = pipeline.load(name)
    typer.echo(loaded.text, nl=False)


@pipelines_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the pipeline file (apiVersion imagegate/v1).

    Example: imagegate pipelines schema > pipeline.schema.json
    """
    from imagegate.pipeline.schema import pipeline_schema_text

    typer.echo(pipeline_schema_text(), nl=False)


@pipelines_app.command("validate")
def validate(path: str = typer.Argument(..., help="A pipeline file.")) -> None:
    """Validate a pipeline file; errors name the file, the line and the key.

    Example: imagegate pipelines validate my-pipeline.yaml
    """
    from imagegate import pipeline

    loaded = pipeline.load(path)
    typer.echo(f"{path}: valid ({loaded.pipeline.name}, {len(loaded.pipeline.stages)} stages)")
