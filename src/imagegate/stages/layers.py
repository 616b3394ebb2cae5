"""The `layers` pipeline stage (outside side): verify the very image the probes ran.

Where the image came from a registry (the engine's RepoDigests name a manifest there, or the
reference is `docker://`), its blobs are read from that registry, layers in parallel: far faster
than an engine export, which the engine prepares whole before its first byte (minutes for 10 GB).
The registry copy is used only when its config digest is the probed image's ID, so what is
verified is still what ran. Otherwise the image is streamed from the same engine by its image
ID. `--source` names another transport instead (the registry copy a cluster will pull). Which
source was read, and why, is in the evidence; per-layer results go to `layers.json`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from imagegate._support.jsontypes import JsonObject
from imagegate.domain.digest import check_digest
from imagegate.domain.results import Status
from imagegate.errors import ImagegateError
from imagegate.oci.layercheck import VerifyReport, verify_source
from imagegate.oci.manifest import parse_platform
from imagegate.oci.reference import parse_reference
from imagegate.oci.registry import RegistryClient
from imagegate.oci.sources.daemon import DaemonArchive
from imagegate.oci.sources.interface import ImageSource, Source
from imagegate.oci.sources.registry import RegistrySource
from imagegate.oci.transports import open_source
from imagegate.pipeline.params import LayersParams
from imagegate.rootfs.known import known_blobs
from imagegate.stages import Outcome, OutsideContext

EVIDENCE_FILE = "layers.json"
DRIVER_VERIFIED = (
    "verified by the driver in this run, one pass per layer (while unpacking it, or to vouch for "
    "its cached root of the same diffIDs): the probes ran on these bytes"
)
DRIVER_CACHED = (
    "verified by the driver for its cached root of the same diffIDs: each layer read and verified "
    "in this run, or a verified pair (digest -> size, diffID) this machine recorded after reading "
    "the blob whole (marked pair_recorded_at: not read in this run)"
)
# Tries while choosing the registry: an unreachable registry falls back to the engine quickly.
PROBE_RETRIES = 1


@dataclass
class Choice:
    """Which source the stage read, and why (evidence)."""

    kind: str  # "source" (--source), "registry", "engine", "driver" (its own unpacking), or "none"
    source: str | None
    why: str
    notes: list[str] = field(default_factory=list)


def _registry_candidates(ctx: OutsideContext) -> list[str]:
    """Registry copies to try, the manifest that ran first, by its digest: a tag is read again
    only where that is unknown or unreadable (and then its config must be the probed one)."""
    refs = []
    img = ctx.image
    if img.repository and img.manifest_digest and "/" in img.repository:
        refs.append(f"{img.repository}@{img.manifest_digest}")
    if ctx.image.reference.startswith("docker://"):
        refs.append(ctx.image.reference[len("docker://") :])
    refs += [r for r in ctx.image.repo_digests if r not in refs]
    return refs


def _try_registry(ctx: OutsideContext, params: LayersParams, ref: str) -> RegistrySource:
    """The registry copy, if it is reachable and holds the probed image; raises otherwise."""
    parsed = parse_reference(ref)
    platform = parse_platform(params.platform or ctx.image.platform or "linux/amd64")
    client = RegistryClient(parsed.endpoint, insecure=params.insecure, retries=PROBE_RETRIES)
    src = RegistrySource(parsed, platform, insecure=params.insecure, client=client)
    try:
        image = src.resolve()
    except BaseException:
        src.close()
        raise
    probed = ctx.image.config_digest
    if probed and image.config.digest != probed:
        src.close()
        raise ImagegateError(f"its config is {image.config.digest}, the probed image is {probed}")
    client.retries = RegistryClient(parsed.endpoint).retries  # reading blobs: the usual retries
    return src


def _open(ctx: OutsideContext, params: LayersParams) -> tuple[Source | None, Choice]:
    if ctx.source:
        src = open_source(ctx.source, platform=params.platform, insecure=params.insecure)
        return src, Choice("source", src.description, "--source names it")
    # The driver's own way to the bytes it ran (Driver.image_source): read first, unless it is an
    # engine's export, which the engine prepares whole before its first byte; then a registry
    # copy of the very same image is read instead, where there is one.
    own = ctx.image_source(ctx.timeout_s) if ctx.image_source and ctx.image.config_digest else None
    if own is not None and not isinstance(own, DaemonArchive):
        return own, Choice("source", own.description, "the source the driver read the image from")
    notes: list[str] = []
    for ref in _registry_candidates(ctx):
        try:
            src = _try_registry(ctx, params, ref)
        except ImagegateError as e:
            notes.append(f"registry copy docker://{ref} not used: {e}")
            continue
        why = (
            "the image was given as docker://"
            if ctx.image.reference.startswith("docker://")
            else "the engine's RepoDigests name this registry manifest (the image was pulled from or pushed to it)"
        )
        return src, Choice("registry", src.description, why + "; its blobs are read directly", notes)
    if own is not None:
        why = (
            "no registry copy could be read (see notes)"
            if notes
            else "the image has no registry digest (built or loaded locally)"
        )
        return own, Choice("engine", own.description, why + "; streamed from the engine that ran it", notes)
    return None, Choice("none", None, "no engine and no registry copy", notes)


def _detail(report: VerifyReport, probed_mismatch: str | None, choice: Choice | None = None) -> str:
    n = len(report.layers)
    parts = [f"config={report.config.actual_digest}", f"diffids={report.verified}/{n}"]
    if choice is not None and choice.kind in ("registry", "engine"):
        parts.append(f"from {choice.kind}" + (" (registry unreadable)" if choice.notes else ""))
    if report.foreign:
        parts.append(f"foreign={report.foreign}")
    known = sum(1 for x in report.layers if x.pair_recorded_at)
    if known:
        parts.append(f"{known} known verified pairs, not read now")
    if report.config.detail:
        parts.append(report.config.detail)
    if probed_mismatch:
        parts.append(probed_mismatch)
    parts += [f"layer {x.index + 1} {x.status}: {x.detail}" for x in report.failed_layers]
    parts += list(report.problems)
    return "; ".join(parts)


def run_layers_stage(ctx: OutsideContext, params: LayersParams) -> Outcome:
    expect = ctx.expect_config_digest or params.expect_config_digest
    verified = _verify(ctx, params, expect)
    if isinstance(verified, Outcome):
        return verified
    report, choice = verified
    return _outcome(ctx, expect, report, choice)


def _verify(
    ctx: OutsideContext, params: LayersParams, expect: str | None
) -> tuple[VerifyReport, Choice] | Outcome:
    """The image's layers verified, and which source was read; an Outcome (its evidence written)
    when no image could be read."""
    source: Source | None = None
    choice: Choice | None = None
    try:
        if expect:
            check_digest(expect, what="expected config digest")
        pre = ctx.verified
        if pre is not None and not ctx.source and pre.config.official_digest == expect:
            # The driver verified these very bytes while unpacking them: not read a second time.
            cached = any(x.pair_recorded_at for x in pre.layers)
            return pre, Choice("driver", pre.source, DRIVER_CACHED if cached else DRIVER_VERIFIED)
        source, choice = _open(ctx, params)
        if source is None:
            return _no_image(ctx, choice)
        with known_blobs(ctx.cache_dir, ctx.no_cache, choice.notes.append) as known:
            report = verify_source(
                source, expect_config=expect, jobs=params.jobs, progress=ctx.progress, known=known
            )
        return report, choice
    except ImagegateError as e:
        data: JsonObject = {
            "error": str(e),
            "hint": e.hint,
            "source_choice": asdict(choice) if choice else None,
        }
        (ctx.stage_dir / EVIDENCE_FILE).write_text(json.dumps(data, indent=2) + "\n")
        return Outcome(Status.ERROR, f"could not read the image: {e}", data)
    finally:
        if isinstance(source, ImageSource):
            source.close()


def _no_image(ctx: OutsideContext, choice: Choice) -> Outcome:
    (ctx.stage_dir / EVIDENCE_FILE).write_text(json.dumps({"source_choice": asdict(choice)}, indent=2))
    if not ctx.has_image:
        # No image ran (run --here checks an environment): there are no layers to verify.
        return Outcome(
            Status.SKIPPED,
            f"no image here: the {ctx.driver} driver checked an environment, not an image; give "
            "--source docker://REF (or docker-archive:PATH, oci:DIR) to verify an image's layers",
        )
    return Outcome(
        Status.ERROR,
        f"no image to read: the {ctx.driver} driver has no engine to stream {ctx.image.reference} from "
        "and it has no readable registry digest; pass --source docker://REF (or docker-archive:PATH, oci:DIR)",
    )


def _outcome(ctx: OutsideContext, expect: str | None, report: VerifyReport, choice: Choice) -> Outcome:
    """PASS when every layer is the declared one and the source holds the probed image; the
    evidence written."""
    probed = ctx.image.config_digest
    probed_mismatch = None
    if ctx.source and probed and report.config.actual_digest != probed:
        # The source holds another image than the one the probes ran: what was tested is not what ships.
        probed_mismatch = (
            f"{ctx.source} has config {report.config.actual_digest}, the probed image is {probed}"
        )
    evidence = {
        "source": report.source,
        "probed_config_digest": probed,
        "expected_config_digest": expect,
        "probed_image_mismatch": probed_mismatch,
        "source_choice": asdict(choice),
        **report.to_dict(),
    }
    (ctx.stage_dir / EVIDENCE_FILE).write_text(json.dumps(evidence, indent=2) + "\n")
    status = Status.PASS if report.ok and not probed_mismatch else Status.FAIL
    summary: JsonObject = {
        "config_digest": report.config.actual_digest,
        "manifest_digest": report.manifest_digest,
        "layers": len(report.layers),
        "verified": report.verified,
        "failed": [f"{x.index + 1}:{x.status}" for x in report.failed_layers],
        "source": choice.kind,
    }
    return Outcome(status, _detail(report, probed_mismatch, choice), summary)
