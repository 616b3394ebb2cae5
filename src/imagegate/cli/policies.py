"""Commands: policies list / write (the admission policies shipped in the package)."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from imagegate.cli._accept import grouped
from imagegate.cli._app import Option, app
from imagegate.cli._identity import Identity
from imagegate.errors import UsageError

if TYPE_CHECKING:
    from imagegate.policies import Filling
    from imagegate.policies.attestors import Signer

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


@dataclass(frozen=True)
class Tuf:
    """Keyless: the TUF repository Kyverno's ImageValidatingPolicy initialises."""

    tuf_mirror: str | None = Option(
        None,
        "--tuf-mirror",
        metavar="URL",
        help="Keyless: the TUF repository the ImageValidatingPolicy initialises (default: the public Sigstore's).",
    )
    tuf_root: Path | None = Option(
        None,
        "--tuf-root",
        metavar="FILE",
        help="Keyless: that TUF repository's root.json (with --tuf-mirror).",
    )


@policies_app.command(
    "write",
    epilog="Examples:\n\n"
    "  imagegate policies write --key imagegate.pub --image 'registry.example/team/*' --out policies/\n\n"
    "  imagegate policies write policy-controller-clusterimagepolicy --key imagegate.pub "
    "--image 'registry.example/*' | kubectl apply -f -   # daily: it renders NOT_BEFORE\n\n"
    "  imagegate policies write --identity https://github.com/org/repo/.github/workflows/gate.yml@refs/heads/main "
    "--issuer https://token.actions.githubusercontent.com --trusted-root trusted_root.json --image 'registry.example/*'"
    "   # keyless: statements `run --attach` signed with a CI identity\n\n"
    "Each file starts with `# written by imagegate VERSION`. Exit 0 written; 3 an unknown name, a key "
    "that is not a PEM public key, an empty or malformed pattern, a --max-age of 0, or a file that "
    "cannot be written; for a keyless policy, a signer not wholly named (--identity or --identity-regexp, "
    "--issuer or --issuer-regexp, --trusted-root) or a file that is not a Sigstore trusted root.",
)
@grouped
def write(
    names: list[str] = typer.Argument(
        None, metavar="[NAME]...", help="Policies to write (imagegate policies list); default: all."
    ),
    key: Path | None = Option(
        None,
        "--key",
        "-k",
        metavar="PUB",
        help="The public key (PEM) the policies trust: your imagegate.pub.",
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
    who: Identity = Identity(),
    tuf: Tuf = Tuf(),
) -> None:
    """Write the shipped policies filled in with your public key, images and freshness bound."""
    from imagegate import policies

    filling = _filling(key, image, max_age, who, tuf)
    chosen = policies.check_names(names or [])
    texts = {name: policies.fill(name, filling) for name in chosen}
    if out is None:
        typer.echo("---\n".join(texts.values()), nl=False)
        return
    written = policies.write_files(texts, out)
    for path in written:
        typer.echo(f"wrote {path}", err=True)


def _filling(key: Path | None, image: str, max_age: str, who: Identity, tuf: Tuf) -> "Filling":
    """What the policies are filled in with: the key or the keyless signer (one of them), the
    image pattern, the bound."""
    import datetime as dt

    from imagegate import __version__, policies
    from imagegate.attest.keys import load_public_key
    from imagegate.attest.word import parse_age

    pattern = policies.check_pattern(image)
    age = parse_age(max_age)
    if age is None:
        raise UsageError(f"--max-age {max_age}: a policy needs a bound", hint="e.g. 168h, 7d, 90m")
    signer = _keyless(who, tuf)
    if (key is None) == (signer is None):
        raise UsageError(
            "policies write needs --key PUB or a keyless signer (--identity, --issuer, --trusted-root), not both",
            hint="imagegate policies write --key imagegate.pub --image 'registry.example/team/*'",
        )
    pem = load_public_key(key).pem.decode() if key is not None else None
    return policies.Filling(pem, pattern, age, dt.datetime.now(dt.timezone.utc), __version__, signer)


def _keyless(who: Identity, tuf: "Tuf") -> "Signer | None":
    """The keyless signer the options name (Identity.named: all of it or none); None when none."""
    from imagegate._support.files import read_named
    from imagegate.attest.keyless import MAX_TRUST_BYTES
    from imagegate.policies.attestors import Signer, read_trust

    tuf_mirror, tuf_root = tuf.tuf_mirror, tuf.tuf_root
    path = who.named("a keyless policy")
    if path is None:
        if tuf_mirror is not None or tuf_root is not None:
            raise UsageError(
                "--tuf-mirror and --tuf-root are for a keyless policy",
                hint="name its --identity, --issuer and --trusted-root",
            )
        return None
    if tuf_root is not None and tuf_mirror is None:
        raise UsageError("--tuf-root needs --tuf-mirror URL", hint="the TUF repository that root.json is of")
    root = read_named(tuf_root, what="--tuf-root", max_bytes=MAX_TRUST_BYTES) if tuf_root else None
    trust = read_trust(path)
    return Signer(who.identity, who.identity_regexp, who.issuer, who.issuer_regexp, trust, tuf_mirror, root)
