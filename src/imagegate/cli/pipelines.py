"""Commands: pipelines list / show / schema."""

import typer

from imagegate.cli._app import app

pipelines_app = typer.Typer(
    help="Built-in pipelines and the pipeline file format.\n\n"
    "Examples:\n\n  imagegate pipelines list\n\n  imagegate pipelines show vllm\n\n"
    "  imagegate pipelines schema > pipeline.schema.json",
    no_args_is_help=True,
)
app.add_typer(pipelines_app, name="pipelines")


@pipelines_app.command("list")
def list_() -> None:
    """List the built-in pipelines (use the name with `run -p NAME`).

    Example: imagegate pipelines list
    """
    from rich.console import Console
    from rich.table import Table

    from imagegate import pipeline  # here, not above: `--help` never loads the pipeline models

    table = Table("name", "version", "stages", "description")
    for name in pipeline.builtin_names():
        p = pipeline.load(name).pipeline
        table.add_row(
            name, p.version, ", ".join(s.id for s in p.stages), (p.description or "").strip().split("\n")[0]
        )
    Console().print(table)


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
