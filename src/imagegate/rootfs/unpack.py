"""materialize(): an image's verified root filesystem, from any source, in one pass per layer.

Each layer's blob is read once: its digest and size, its diffID and the layer's tar entries
applied to the root all come from the same bytes (`digest_blob`'s tap feeds the applier, in
its own thread). Layers are applied in order; the first layer that fails verification or holds
a hostile entry discards the whole root, so nothing unverified is ever used."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import replace

from imagegate._support.jsontypes import JsonMapping
from imagegate.oci.hashing import BlobDigests, digest_blob
from imagegate.oci.layercheck import (
    ConfigResult,
    LayerResult,
    LayerStatus,
    NoProgress,
    Progress,
    VerifyReport,
    check_config,
    judge_layer,
    read_config,
)
from imagegate.oci.manifest import Descriptor
from imagegate.oci.sources.interface import (
    ArchiveStream,
    BlobNotFound,
    ImageSource,
    ResolvedImage,
    Source,
)
from imagegate.rootfs.apply import COPY_CHUNK, EntryRefused, EntryTooLarge, LayerApplier
from imagegate.rootfs.cache import Build, RootCache
from imagegate.rootfs.reuse import reuse
from imagegate.rootfs.root import (
    ConfigRefused,
    HostileLayer,
    LayerRefused,
    Limits,
    Root,
    chain_id,
    image_settings,
    layer_label,
)
from imagegate.rootfs.spool import spool_archive
from imagegate.rootfs.tree import RootDir

# Decompressed bytes the verifier may run ahead of the applier (bounded memory).
FEED_DEPTH = 4
# The verifier's own bomb bound sits past the applier's, so that the applier, which knows the
# entry, is the one that stops a bomb and names it.
_VERIFIER_SLACK = 64 << 20

_DONE = object()


log = logging.getLogger(__name__)


def materialize(
    source: Source,
    *,
    cache: RootCache,
    expect_config: str | None = None,
    limits: Limits = Limits(),
    progress: Progress | None = None,
) -> Root:
    """The verified root of the image `source` names: from the cache when an earlier run
    unpacked the same layers (same chainID), else unpacked now while verifying every layer.
    Raises ConfigRefused / LayerRefused / HostileLayer (nothing kept), or SourceError and other
    ImagegateErrors when the source cannot be read. The root is held in `cache` (not evicted)
    until cache.release(root) or cache.close()."""
    progress = progress or NoProgress()
    if isinstance(source, ArchiveStream):
        # Read once, front to back, metadata last: keep the blobs, then unpack from them.
        with cache.working("spool") as work:

            def waiting(elapsed: float, done: bool) -> None:  # an engine preparing its export
                progress.waiting(source.description, elapsed, done)

            with spool_archive(source, work, max_bytes=limits.max_total_bytes, waiting=waiting) as spooled:
                return materialize(
                    spooled, cache=cache, expect_config=expect_config, limits=limits, progress=progress
                )
    image = source.resolve()
    config, doc, diff_ids, problems = check_config(
        image.config, read_config(source, image.config), expect_config
    )
    if len(image.layers) != len(diff_ids):
        problems.append(
            f"the manifest has {len(image.layers)} layers but the config lists {len(diff_ids)} diffIDs"
        )
    report = _report(source, image, config, (), diff_ids, problems, doc)
    if not report.ok:
        why = config.detail or "; ".join(problems) or str(config.status)
        raise ConfigRefused(
            f"{source.description}: config {config.actual_digest}: {why}; nothing unpacked",
            hint="the image's config is not the one expected: check --expect-config and the source",
            report=report,
        )
    chain = chain_id(diff_ids)
    hit = cache.get(chain)
    if hit is not None:
        return _reused(source, image, hit, report, cache, limits, progress, doc)
    with cache.building(chain) as build:
        hit = cache.get(chain)  # made by a run that held the build lock before us
        if hit is not None:
            return _reused(source, image, hit, report, cache, limits, progress, doc)
        return _unpack(source, image, report, build, cache, limits, progress, doc)


def _reused(
    source: ImageSource,
    image: ResolvedImage,
    hit: Root,
    report: VerifyReport,
    cache: RootCache,
    limits: Limits,
    progress: Progress,
    doc: JsonMapping,
) -> Root:
    """The cached root of the same layers, for this source (rootfs/reuse.py); not held when refused."""
    try:
        return reuse(source, image, hit, report, cache.pairs, limits, progress, doc)
    except BaseException:
        cache.release(hit)
        raise


def _report(
    source: ImageSource,
    image: ResolvedImage,
    config: ConfigResult,
    layers: tuple[LayerResult, ...],
    diff_ids: tuple[str, ...],
    problems: list[str],
    doc: JsonMapping,
) -> VerifyReport:
    platform = image.platform
    if platform is None:
        platform = "/".join(str(doc[k]) for k in ("os", "architecture", "variant") if doc.get(k)) or None
    return VerifyReport(
        source=source.description,
        manifest_media_type=image.manifest_media_type,
        manifest_digest=image.manifest_digest,
        index_digest=image.index_digest,
        platform=platform,
        config=config,
        layers=layers,
        diff_ids=diff_ids,
        problems=tuple(problems),
        config_doc=doc,
    )


def _unpack(
    source: ImageSource,
    image: ResolvedImage,
    report: VerifyReport,
    build: Build,
    cache: RootCache,
    limits: Limits,
    progress: Progress,
    doc: JsonMapping,
) -> Root:
    os.mkdir(build.rootfs, 0o755)
    root_dir = RootDir(build.rootfs)
    applier = LayerApplier(root_dir)
    results: list[LayerResult] = []
    n = len(image.layers)
    before = 0  # uncompressed bytes of the layers already applied
    try:
        for i, desc in enumerate(image.layers):
            label = layer_label(i, n, desc.digest)
            expected = report.diff_ids[i]
            feed = _TarFeed()
            budget = _budget(feed, before, limits)
            feed.start(lambda stream, budget=budget: applier.apply(stream, budget))  # type: ignore[misc]
            progress.started(i, label, desc.size)
            log.debug("%s: unpacking %s", source.description, label)
            got, known, applied = _read_layer(
                source,
                desc,
                feed,
                limits,
                lambda k, i=i: progress.advanced(i, k),  # type: ignore[misc]
            )
            before += feed.count
            result = _judge(i, desc, expected, image.foreign_diff_ids, got, known, applied)
            progress.finished(i, "REFUSED" if result is None else result.status.value)
            partial = replace_layers(report, (*results, *([result] if result else [])))
            _refuse(f"{label} of {source.description}", i, result, applied, partial)
            assert result is not None
            cache.pairs.record(result)  # read whole and matched in this one pass
            results.append(result)
        applier.finish()
    finally:
        root_dir.close()
    return _commit(source, report, build, cache, applier, tuple(results), doc)


def _budget(feed: _TarFeed, before: int, limits: Limits) -> Callable[[str, int], None]:
    """The applier's check before it writes an entry's bytes: the layer's and the image's bounds
    on uncompressed bytes (`before`: the layers already applied)."""

    def budget(entry: str, size: int) -> None:
        if feed.count + size > limits.max_layer_bytes:
            raise EntryTooLarge(
                entry,
                f"{size} bytes would take the layer past {limits.max_layer_bytes} uncompressed "
                "bytes, the bound (a decompression bomb?)",
            )
        if before + feed.count + size > limits.max_total_bytes:
            raise EntryTooLarge(
                entry,
                f"{size} bytes would take the image past {limits.max_total_bytes} uncompressed "
                "bytes, the bound (a decompression bomb?)",
            )

    return budget


def _read_layer(
    source: ImageSource,
    desc: Descriptor,
    feed: _TarFeed,
    limits: Limits,
    on_bytes: Callable[[int], None],
) -> tuple[BlobDigests | None, int | None, BaseException | None]:
    """One pass over the layer's blob, verifying it and feeding the applier: its digests (None
    when the source lacks the blob or the applier stopped the pass), the size the source knew,
    and the applier's error."""
    got, known = None, None
    try:
        with source.open_blob(desc) as r:
            got = digest_blob(
                r,
                algorithm=(desc.digest or "sha256").partition(":")[0],
                declared_size=desc.size,
                max_uncompressed=limits.max_layer_bytes + _VERIFIER_SLACK,
                on_bytes=on_bytes,
                tap=feed.put,
                what=f"{source.description}: the blob {desc.digest or desc.locator}",
            )
            known = getattr(r, "size", None)
    except BlobNotFound:
        got = None
    except EntryRefused:
        pass  # the applier's error, taken from the feed below
    finally:
        applied = feed.finish()
    return got, known, applied


def _judge(
    i: int,
    desc: Descriptor,
    expected: str,
    foreign_diff_ids: frozenset[str],
    got: BlobDigests | None,
    known: int | None,
    applied: BaseException | None,
) -> LayerResult | None:
    """The layer's verification result; None when the applier stopped the pass before the
    blob was read to its end (nothing to judge)."""
    if got is None and applied is None:
        return judge_layer(i, desc, expected, None, foreign=expected in foreign_diff_ids)
    if got is not None:
        return judge_layer(i, desc, expected, got, foreign=expected in foreign_diff_ids, known_size=known)
    return None


def _refuse(
    label: str, i: int, result: LayerResult | None, applied: BaseException | None, partial: VerifyReport
) -> None:
    """Raises when the layer cannot be kept: LayerRefused when its bytes are not the declared
    ones, HostileLayer when the applier refused one of its entries."""
    bomb = isinstance(applied, EntryTooLarge)
    if result is not None and result.status is not LayerStatus.OK and not bomb:
        # Verification first: bytes that are not the declared ones say nothing about content.
        what = "not in the source" if result.status is LayerStatus.FOREIGN else result.detail
        raise LayerRefused(
            f"{label}: {result.status}: {what}; the root was discarded",
            hint="the registry or file does not hold the image's declared bytes (tampered or corrupt)",
            layer=i,
            report=partial,
        )
    if applied is not None:
        entry = getattr(applied, "entry", "?")
        raise HostileLayer(
            f"{label}: entry {entry!r} refused: {applied}; the root was discarded",
            hint="this layer was not written by an image builder; do not run this image",
            layer=i,
            entry=entry,
            report=partial,
        ) from applied


def _commit(
    source: ImageSource,
    report: VerifyReport,
    build: Build,
    cache: RootCache,
    applier: LayerApplier,
    results: tuple[LayerResult, ...],
    doc: JsonMapping,
) -> Root:
    """The unpacked root, with every layer verified, into the cache."""
    settings = image_settings(doc)
    assert report.config.actual_digest is not None
    root = Root(
        path=os.path.join(build.path, "rootfs"),
        chain_id=build.chain_id,
        config_digest=report.config.actual_digest,
        manifest_digest=report.manifest_digest,
        report=replace_layers(report, results),
        not_applied=applier.skipped.notes(),
        size=applier.bytes_written,
        unpacked_from=source.description,
        **settings,
    )
    committed = cache.commit(build, root)
    return replace(committed, report=root.report, cached=False)


def replace_layers(report: VerifyReport, layers: tuple[LayerResult, ...]) -> VerifyReport:
    return replace(report, layers=layers)


class _TarFeed:
    """Push (the verifier's decompressed pieces) to pull (tarfile's reads), through a small
    bounded queue to the applier's thread. After an applier error the rest of the layer is
    still verified (a tampered blob is then named as tampered, not as hostile) and its pieces
    dropped; only a bomb stops the verifier's pass at once (raised in the pusher). finish()
    returns the applier's error."""

    def __init__(self) -> None:
        self._q: queue.Queue[object] = queue.Queue(FEED_DEPTH)
        self._buf, self._pos, self._eof = b"", 0, False
        self.count = 0  # decompressed bytes the applier has read
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, consume: Callable[[_TarFeed], object]) -> None:
        self._thread = threading.Thread(target=self._run, args=(consume,), name="layer-apply", daemon=True)
        self._thread.start()

    def _run(self, consume: Callable[[_TarFeed], object]) -> None:
        try:
            consume(self)
            while self.read(COPY_CHUNK):  # the tar's end-of-archive padding
                pass
        except BaseException as e:  # raised in the pusher, then returned by finish()
            self.error = e
            while not self._eof:  # keep taking pieces so that the pusher never blocks
                if self._q.get() is _DONE:
                    self._eof = True

    def put(self, data: bytes) -> None:
        if isinstance(self.error, EntryTooLarge):
            raise self.error
        self._q.put(data)

    def read(self, n: int = COPY_CHUNK) -> bytes:
        if self._pos >= len(self._buf):
            if self._eof:
                return b""
            item = self._q.get()
            if item is _DONE:
                self._eof = True
                return b""
            self._buf, self._pos = item, 0  # type: ignore[assignment]
        out = self._buf[self._pos : self._pos + n] if self._pos or n < len(self._buf) else self._buf
        self._pos += len(out)
        self.count += len(out)
        return out

    def finish(self) -> BaseException | None:
        """End of the stream; waits for the applier. Its error, if any."""
        self._q.put(_DONE)
        assert self._thread is not None
        self._thread.join()
        return self.error
