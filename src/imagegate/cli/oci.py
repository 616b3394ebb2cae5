"""Commands: layers, compare (image identity). Parse, call imagegate.oci, render."""

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer import Argument

from imagegate.cli import _app
from imagegate.cli._app import Format, Option, app, show
from imagegate.errors import UsageError

if TYPE_CHECKING:  # every layer below and the views are imported where used: `--help` loads none
    from imagegate.attest import keys
    from imagegate.oci.compare import CompareResult


@app.command(
    epilog="Examples:\n\n"
    "  imagegate layers myorg/vllm:0.11\n\n"
    "  imagegate layers docker-daemon:myorg/vllm:0.11 --expect-config sha256:4f0c...\n\n"
    "  imagegate layers docker-archive:vllm.tar --format json > layers.json\n\n"
    "  imagegate layers oci:./layout:0.11 --platform linux/arm64\n\n"
    "  imagegate layers 127.0.0.1:5000/team/app:1 --jobs 8\n\n"
    "Exit codes: 0 every layer verified, 1 a mismatch (or not the expected config), "
    "2 the image could not be read (or --timeout passed), 3 usage or input error."
)
def layers(
    source: str = _app.SOURCE,
    expect_config: str | None = _app.EXPECT_CONFIG,
    platform: str | None = _app.PLATFORM,
    insecure: bool = _app.INSECURE,
    jobs: int | None = _app.JOBS,
    fmt: Format = _app.FORMAT,
    max_layer_size: str = _app.MAX_LAYER,
    quiet: bool = _app.QUIET,
    timeout: float = _app.TIMEOUT,
    cache_dir: str | None = _app.CACHE_DIR,
    no_cache: bool = _app.NO_CACHE,
) -> None:
    """Verify an image's config digest, every layer's digest and size, and every diffID."""
    from imagegate._support.sizes import parse_size
    from imagegate.domain.digest import check_digest
    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED
    from imagegate.oci.layercheck import verify_source
    from imagegate.oci.transports import open_sources  # lazy: the OCI modules load when a command runs
    from imagegate.report import console_oci
    from imagegate.report.progress import layer_progress

    if expect_config:
        check_digest(expect_config, what="--expect-config")
    limit = parse_size(max_layer_size)
    with (
        _app.within(timeout),
        open_sources([source], platform=platform, insecure=insecure) as (src,),
        _app.known_blobs(cache_dir, no_cache) as known,
        layer_progress(quiet) as sink,
    ):
        report = verify_source(
            src, expect_config=expect_config, jobs=jobs, max_uncompressed=limit, progress=sink, known=known
        )
    show(fmt, report.to_dict, partial(console_oci.render_verify, report))
    raise typer.Exit(EXIT_ACCEPTED if report.ok else EXIT_REJECTED)


# compare --attest: who signs, what is carried over, whose signature on it is trusted.
ATTEST = Option(
    None,
    "--attest",
    metavar="KEY",
    help="Sign the equivalence of the two manifests with this key (same content only; implies --deep).",
)
CARRY = Option(
    None,
    "--carry",
    metavar="ATTESTATION",
    help="With --attest: the official image's signed acceptance, carried over to MIRROR as a VSA and a test-result.",
)
TRUST = _app.TRUST


@app.command(
    name="compare",
    epilog="Examples:\n\n"
    "  imagegate compare docker.io/vllm/vllm-openai:v0.11.0 mirror.example/vllm/vllm-openai:v0.11.0\n\n"
    "  imagegate compare docker-archive:official.tar 127.0.0.1:5000/vllm:0.11 --deep\n\n"
    "Says exactly one of: identical (same manifest digest; no blob read unless --deep); same "
    "content (config digest equal, every diffID verified, compression may differ); different image "
    "(with the layers and config fields that differ); corrupt (a blob does not match).\n\n"
    "With --attest KEY, same content between two registry images is signed as one statement "
    "naming both manifests (mirror.dsse.json); --carry ACCEPTANCE adds a VSA and a test-result "
    "for MIRROR resting on it. Nothing is signed for a different or corrupt image.\n\n"
    "Each tag is read once and everything after by the digest it named; a tag that names "
    "another manifest by the end is undecided (exit 2, nothing signed): pin REPO@sha256:...\n\n"
    "Exit codes: 0 same content, 1 different or corrupt, 2 could not decide (or --timeout "
    "passed, or a tag moved), 3 usage error.",
)
def compare_cmd(
    official: str = Argument(..., help="The official image. " + _app.SOURCES_HELP),
    mirror: str = Argument(..., help="The copy to audit, in the same forms."),
    deep: bool = Option(
        False, "--deep", help="Read and verify every blob of both images, even if identical."
    ),
    platform: str | None = _app.PLATFORM,
    insecure: bool = _app.INSECURE,
    jobs: int | None = _app.JOBS,
    fmt: Format = _app.FORMAT,
    max_layer_size: str = _app.MAX_LAYER,
    quiet: bool = _app.QUIET,
    timeout: float = _app.TIMEOUT,
    attest: Path | None = ATTEST,
    out: Path = Option(Path("."), "--out", "-o", help="With --attest: the folder the signed files go to."),
    carry: Path | None = CARRY,
    trust: list[Path] = TRUST,
    cache_dir: str | None = _app.CACHE_DIR,
    no_cache: bool = _app.NO_CACHE,
) -> None:
    """Is MIRROR the same content as OFFICIAL? Exact about what differs."""
    from imagegate._support.sizes import parse_size
    from imagegate.oci.compare import compare
    from imagegate.oci.transports import open_sources
    from imagegate.report import console_oci
    from imagegate.report.progress import layer_progress

    limit, key = parse_size(max_layer_size), _signing_key(attest, carry)
    with (
        _app.within(timeout),
        open_sources([official, mirror], platform=platform, insecure=insecure) as (a, b),
        _app.known_blobs(cache_dir, no_cache) as known,
        layer_progress(quiet) as sink,
    ):
        result = compare(
            a, b, deep=deep or bool(key), jobs=jobs, max_uncompressed=limit, progress=sink, known=known
        )
    show(fmt, result.to_dict, partial(console_oci.render_compare, result))
    if key is not None:
        _sign(result, key, out, carry, trust)
    raise typer.Exit(result.exit_code)


def _sign(
    result: "CompareResult", key: "keys.SigningKey", out: Path, carry: Path | None, trust: list[Path]
) -> None:
    """compare --attest: same content signed (with what --carry carries over), else said unsigned."""
    from imagegate.attest import keys
    from imagegate.attest import mirror as equivalence
    from imagegate.errors import EXIT_ACCEPTED
    from imagegate.report import console_oci

    if result.exit_code != EXIT_ACCEPTED:
        console_oci.render_not_signed(result)
        return
    carried = None
    if carry is not None:
        trusted = keys.trusted_keys(trust) or (key.public,)
        carried = equivalence.verified_acceptance(carry, trusted, str(result.official.manifest_digest))
    signed = equivalence.sign_equivalence(result, key, out, carried)
    console_oci.render_equivalence(signed.files, key.public.fingerprint)


def _signing_key(attest: Path | None, carry: Path | None) -> "keys.SigningKey | None":
    from imagegate.attest import keys

    if attest is None:
        if carry is not None:
            raise UsageError(
                "--carry needs --attest KEY: the carried statements are signed", hint="add --attest KEY"
            )
        return None
    return keys.resolve_signing_key(str(attest), create_default=False)
