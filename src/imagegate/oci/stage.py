"""The `layers` pipeline stage (outside side): verify the very image the probes ran.

For the docker driver the image is streamed from the same engine by its image ID (the config
digest), so what is verified is what ran; `--source` names another transport instead (the
registry copy a cluster will pull). Per-layer results go to `layers.json` in the stage folder."""

from __future__ import annotations

import json

from imagegate.errors import ImagegateError
from imagegate.model import Status
from imagegate.oci.digest import check_digest
from imagegate.oci.sources.daemon import DaemonArchive
from imagegate.oci.sources.interface import ImageSource, Source
from imagegate.oci.transports import open_source
from imagegate.oci.verify import VerifyReport, verify_source
from imagegate.outside import Outcome, OutsideContext
from imagegate.pipeline.params import LayersParams

EVIDENCE_FILE = "layers.json"


def _open(ctx: OutsideContext, params: LayersParams) -> Source | None:
    if ctx.source:
        return open_source(ctx.source, platform=params.platform, insecure=params.insecure)
    if ctx.driver == "docker" and ctx.docker_client is not None and ctx.image.config_digest:
        return DaemonArchive(ctx.image.config_digest, ctx.docker_client)
    return None


def _detail(report: VerifyReport, probed_mismatch: str | None) -> str:
    n = len(report.layers)
    parts = [f"config={report.config.actual_digest}", f"diffids={report.verified}/{n}"]
    if report.foreign:
        parts.append(f"foreign={report.foreign}")
    if report.config.detail:
        parts.append(report.config.detail)
    if probed_mismatch:
        parts.append(probed_mismatch)
    parts += [f"layer {x.index + 1} {x.status}: {x.detail}" for x in report.failed_layers]
    parts += list(report.problems)
    return "; ".join(parts)


def run_layers_stage(ctx: OutsideContext, params: LayersParams) -> Outcome:
    expect = ctx.expect_config_digest or params.expect_config_digest
    source: Source | None = None
    try:
        if expect:
            check_digest(expect, what="expected config digest")
        source = _open(ctx, params)
        if source is None:
            return Outcome(
                Status.ERROR,
                f"no image to read: the {ctx.driver} driver has no engine to stream {ctx.image.reference} from; "
                "pass --source docker://REF (or docker-archive:PATH, oci:DIR)",
            )
        progress = ctx.options.get("layer_progress")  # a verify.Progress from the CLI, on a terminal
        report = verify_source(source, expect_config=expect, jobs=params.jobs, progress=progress)
    except ImagegateError as e:
        data = {"error": str(e), "hint": e.hint}
        (ctx.stage_dir / EVIDENCE_FILE).write_text(json.dumps(data, indent=2) + "\n")
        return Outcome(Status.ERROR, f"could not read the image: {e}", data)
    finally:
        if isinstance(source, ImageSource):
            source.close()
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
        **report.to_dict(),
    }
    (ctx.stage_dir / EVIDENCE_FILE).write_text(json.dumps(evidence, indent=2) + "\n")
    status = Status.PASS if report.ok and not probed_mismatch else Status.FAIL
    summary = {
        "config_digest": report.config.actual_digest,
        "manifest_digest": report.manifest_digest,
        "layers": len(report.layers),
        "verified": report.verified,
        "failed": [f"{x.index + 1}:{x.status}" for x in report.failed_layers],
    }
    return Outcome(status, _detail(report, probed_mismatch), summary)
