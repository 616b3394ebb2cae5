"""Commands: policies list / write (the admission policies shipped in the package)."""

from pathlib import Path

import typer

from imagegate.cli._app import Option, app
from imagegate.errors import UsageError

policies_app = typer.Typer(
    help="The admission policies of this version (Kyverno, Sigstore policy-controller), filled in "
    "with your key and images.\n\n"
    "Examples:\n\n  imagegate policies list\n\n"
    "  imagegate policies write kyverno-clusterpolicy --key imagegate.pub --image 'registry.example/team/*' "
    "| kubectl apply -f -",
    no_args_is_help=True,
)
app.add_typer(policies_app, name="policies")


@policies_app.command("list")
def list_() -> None:
    """List the shipped policies: name, controller, what it enforces (one line each).

    Example: imagegate policies list
    """
    from imagegate.policies import ENFORCES, POLICIES

    rows = [("NAME", "CONTROLLER", "ENFORCES")] + [(p.name, p.controller, p.enforces) for p in POLICIES]
    widths = [max(len(r[i]) for r in rows) for i in (0, 1)]
    for name, controller, enforces in rows:
        typer.echo(f"{name:<{widths[0]}}  {controller:<{widths[1]}}  {enforces}")
    typer.echo(f"\n{ENFORCES}")


@policies_app.command(
    "write",
    epilog="Examples:\n\n"
    "  imagegate policies write --key imagegate.pub --image 'registry.example/team/*' --out policies/\n\n"
    "  imagegate policies write policy-controller-clusterimagepolicy --key imagegate.pub "
    "--image 'registry.example/*' | kubectl apply -f -   # daily: it renders NOT_BEFORE\n\n"
    "Each file starts with `# written by imagegate VERSION`. Exit 0 written; 3 an unknown name, a key "
    "that is not a PEM public key, an empty or malformed pattern, a --max-age of 0, or a file that "
    "cannot be written.",
)
def write(
    names: list[str] = typer.Argument(
        None, metavar="[NAME]...", help="Policies to write (imagegate policies list); default: all."
    ),
    key: Path = Option(
        ..., "--key", "-k", metavar="PUB", help="The public key (PEM) the policies trust: your imagegate.pub."
    ),
    image: str = Option(
        ...,
        "--image",
        metavar="PATTERN",
        help="The images the policies guard: * matches any characters, / too (e.g. 'registry.example/team/*').",
    ),
    out: Path | None = Option(
        None,
        "--out",
        "-o",
        metavar="DIR",
        help="Write NAME.yaml files into DIR (default: stdout, one stream).",
    ),
    max_age: str = Option(
        "168h",
        "--max-age",
        metavar="AGE",
        help="How long ago a VSA may have been verified (in s, m, h or d).",
    ),
) -> None:
    """Write the shipped policies filled in with your public key, images and freshness bound."""
    import datetime as dt

    from imagegate import __version__, policies
    from imagegate.attest.keys import load_public_key
    from imagegate.attest.word import parse_age

    chosen = policies.check_names(names or [])
    pattern = policies.check_pattern(image)
    age = parse_age(max_age)
    if age is None:
        raise UsageError(f"--max-age {max_age}: a policy needs a bound", hint="e.g. 168h, 7d, 90m")
    now = dt.datetime.now(dt.timezone.utc)
    filling = policies.Filling(load_public_key(key).pem.decode(), pattern, age, now, __version__)
    texts = {name: policies.fill(name, filling) for name in chosen}
    if out is None:
        typer.echo("---\n".join(texts.values()), nl=False)
        return
    written = policies.write_files(texts, out)
    for path in written:
        typer.echo(f"wrote {path}", err=True)
