"""A cached root reused for another source of the same layers: content, never identity.

The root was unpacked from some earlier source with the same chainID; it stands in for *this*
source's layers only where each of them is known to be those bytes: a verified pair this machine
recorded (rootfs/pairs.py) with this manifest's digest and size and this config's diffID at that
position, or the blob read and verified now (digest, size and diffID in one pass; nothing is
unpacked). A layer that fails is refused exactly as unpacking refuses it (LayerRefused), before
any probe runs. The Root returned names this source's config and manifest digests and carries
this config's Env, User, WorkingDir, Entrypoint and Cmd."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from imagegate._support.jsontypes import JsonMapping
from imagegate.oci.hashing import digest_blob
from imagegate.oci.layercheck import (
    LayerResult,
    LayerStatus,
    Progress,
    VerifyReport,
    default_jobs,
    judge_layer,
)
from imagegate.oci.manifest import Descriptor
from imagegate.oci.sources.interface import BlobNotFound, ImageSource, ResolvedImage
from imagegate.rootfs.pairs import Pair, PairStore
from imagegate.rootfs.root import LayerRefused, Limits, Root, image_settings, layer_label


def reuse(
    source: ImageSource,
    image: ResolvedImage,
    hit: Root,
    report: VerifyReport,
    pairs: PairStore,
    limits: Limits,
    progress: Progress,
    doc: JsonMapping,
) -> Root:
    """`hit` as the root of this source, every layer known or verified now; raises LayerRefused."""
    layers = check_layers(source, image, report, pairs, limits, progress)
    assert report.config.actual_digest is not None
    return replace(
        hit,
        config_digest=report.config.actual_digest,
        manifest_digest=report.manifest_digest,
        report=replace(report, layers=layers),
        cached=True,
        **image_settings(doc),
    )


def known_pair(pairs: PairStore, desc: Descriptor, expected_diff_id: str) -> Pair | None:
    """The recorded pair that vouches for this layer: the manifest's digest and size, the config's
    diffID; None when there is none (the blob must be read)."""
    pair = pairs.get(desc.digest)
    if pair is None or desc.size is None or pair.size != desc.size or pair.diff_id != expected_diff_id:
        return None
    return pair


def pair_result(i: int, desc: Descriptor, pair: Pair) -> LayerResult:
    return LayerResult(
        index=i,
        status=LayerStatus.OK,
        media_type=desc.media_type,
        compression=pair.compression,
        expected_digest=desc.digest,
        actual_digest=pair.digest,
        expected_size=desc.size,
        actual_size=pair.size,
        expected_diff_id=pair.diff_id,
        actual_diff_id=pair.diff_id,
        uncompressed_size=pair.uncompressed_size,
        detail=f"not read in this run: a verified pair this machine recorded at {pair.recorded_at}",
        urls=desc.urls,
        pair_recorded_at=pair.recorded_at,
    )


def check_layers(
    source: ImageSource,
    image: ResolvedImage,
    report: VerifyReport,
    pairs: PairStore,
    limits: Limits,
    progress: Progress,
) -> tuple[LayerResult, ...]:
    """Every layer's result, known pairs first, the rest read now (in parallel); the first layer
    (in manifest order) that is not OK refuses the image."""
    n = len(image.layers)
    results: dict[int, LayerResult] = {}
    unknown = []
    for i, desc in enumerate(image.layers):
        pair = known_pair(pairs, desc, report.diff_ids[i])
        if pair is not None:
            results[i] = pair_result(i, desc, pair)
        else:
            unknown.append(i)

    def one(i: int) -> LayerResult:
        result = read_layer(source, image, i, report.diff_ids[i], limits, progress)
        pairs.record(result)
        return result

    if unknown:
        with ThreadPoolExecutor(
            max_workers=min(len(unknown), default_jobs()), thread_name_prefix="layer"
        ) as pool:
            results.update(zip(unknown, pool.map(one, unknown), strict=True))
    ordered = tuple(results[i] for i in range(n))
    for r in ordered:
        if r.status is not LayerStatus.OK:
            what = "not in the source" if r.status is LayerStatus.FOREIGN else r.detail
            raise LayerRefused(
                f"{layer_label(r.index, n, r.expected_digest)} of {source.description}: {r.status}: {what}; "
                "the cached root of the same layers was not used",
                hint="the registry or file does not hold the image's declared bytes (tampered or corrupt)",
                layer=r.index,
                report=replace(report, layers=ordered[: r.index + 1]),
            )
    return ordered


def read_layer(
    source: ImageSource, image: ResolvedImage, i: int, expected: str, limits: Limits, progress: Progress
) -> LayerResult:
    """One layer's blob read whole: digest, size and diffID in one pass (nothing written)."""
    desc = image.layers[i]
    progress.started(i, layer_label(i, len(image.layers), desc.digest), desc.size)
    try:
        with source.open_blob(desc) as r:
            got = digest_blob(
                r,
                algorithm=(desc.digest or "sha256").partition(":")[0],
                declared_size=desc.size,
                max_uncompressed=limits.max_layer_bytes,
                on_bytes=lambda k: progress.advanced(i, k),
                what=f"{source.description}: {layer_label(i, len(image.layers), desc.digest)}",
            )
            known = getattr(r, "size", None)
    except BlobNotFound:
        got, known = None, None
    result = judge_layer(i, desc, expected, got, foreign=expected in image.foreign_diff_ids, known_size=known)
    progress.finished(i, result.status.value)
    return result
