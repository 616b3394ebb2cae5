"""Layer identity: the config digest, each layer's compressed digest and size against the
manifest, and each diffID (sha256 of the decompressed stream) against the config's
`rootfs.diff_ids`. One streaming pass per blob, layers in parallel, bounded memory; outcomes
are data (a status per layer), never exceptions. A source that cannot be read raises."""

from __future__ import annotations

import enum
import io
import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Protocol, TypedDict

from imagegate._support.jsontypes import JsonMapping, JsonObject, obj
from imagegate.domain.digest import digest_of
from imagegate.oci import untrusted_json
from imagegate.oci.hashing import DEFAULT_MAX_UNCOMPRESSED, BlobDigests, digest_blob
from imagegate.oci.manifest import Descriptor
from imagegate.oci.sources.archive import resolve_archive
from imagegate.oci.sources.interface import (
    MAX_CONFIG_BYTES,
    ArchiveStream,
    BlobNotFound,
    ImageSource,
    ResolvedImage,
    Source,
    SourceError,
)
from imagegate.oci.sources.layout import blob_path

log = logging.getLogger(__name__)


class LayerStatus(str, enum.Enum):
    OK = "OK"
    DIGEST_MISMATCH = "DIGEST_MISMATCH"  # the blob's bytes are not the ones the manifest names
    SIZE_MISMATCH = "SIZE_MISMATCH"  # the blob is shorter or longer than the manifest says
    DIFFID_MISMATCH = "DIFFID_MISMATCH"  # decompressed content differs from the config's diffID
    DECOMPRESS_ERROR = "DECOMPRESS_ERROR"  # corrupt, truncated, or past the decompression limit
    MISSING = "MISSING"  # the source has no such blob
    FOREIGN = "FOREIGN"  # non-distributable layer, not in the source: reported, not verified

    def __str__(self) -> str:
        return self.value


FAILING = frozenset(s for s in LayerStatus if s not in (LayerStatus.OK, LayerStatus.FOREIGN))


@dataclass(frozen=True)
class LayerResult:
    index: int
    status: LayerStatus
    media_type: str
    compression: str | None  # detected from the bytes
    expected_digest: str | None
    actual_digest: str | None
    expected_size: int | None
    actual_size: int | None
    expected_diff_id: str | None
    actual_diff_id: str | None
    uncompressed_size: int | None
    detail: str
    urls: tuple[str, ...] = ()
    # Not read in this run: a verified pair (digest -> size, diffID) this machine recorded at
    # this time (UTC) after reading the blob whole stood in for it (rootfs/pairs.py).
    pair_recorded_at: str | None = None


@dataclass(frozen=True)
class ConfigResult:
    status: LayerStatus  # OK, DIGEST_MISMATCH, SIZE_MISMATCH or MISSING
    expected_digest: str | None  # from the manifest
    actual_digest: str | None
    expected_size: int | None
    actual_size: int | None
    official_digest: str | None = None  # --expect-config
    detail: str = ""

    @property
    def matches_official(self) -> bool | None:
        return None if self.official_digest is None else self.actual_digest == self.official_digest


@dataclass(frozen=True)
class VerifyReport:
    source: str
    manifest_media_type: str
    manifest_digest: str | None
    index_digest: str | None
    platform: str | None
    config: ConfigResult
    layers: tuple[LayerResult, ...]
    diff_ids: tuple[str, ...]  # as the config declares them
    problems: tuple[str, ...] = ()  # structural: e.g. the config lists fewer diffIDs than layers
    # Seconds the source took to send its first byte (an engine preparing its export).
    source_wait_s: float | None = None
    # The parsed config, for compare; not part of the evidence (its digest is).
    config_doc: JsonMapping = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return (
            self.config.status is LayerStatus.OK
            and self.config.matches_official is not False
            and not self.problems
            and not any(x.status in FAILING for x in self.layers)
        )

    @property
    def failed_layers(self) -> tuple[LayerResult, ...]:
        return tuple(x for x in self.layers if x.status in FAILING)

    @property
    def verified(self) -> int:
        return sum(1 for x in self.layers if x.status is LayerStatus.OK)

    @property
    def foreign(self) -> int:
        return sum(1 for x in self.layers if x.status is LayerStatus.FOREIGN)

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d.pop("config_doc")
        d["ok"] = self.ok
        d["config"]["matches_official"] = self.config.matches_official
        plain: JsonObject = json.loads(json.dumps(d, default=str))  # a dict dumped: an object
        return plain


class Progress(Protocol):
    """Per-blob progress, called from worker threads; `waiting` is told every second while a
    source (an engine preparing its export) has sent no byte yet, and once more when the first
    arrives."""

    def started(self, key: int, label: str, total: int | None) -> None: ...
    def advanced(self, key: int, nbytes: int) -> None: ...
    def finished(self, key: int, status: str) -> None: ...
    def waiting(self, what: str, elapsed: float, done: bool) -> None: ...


class NoProgress:
    def started(self, key: int, label: str, total: int | None) -> None:
        pass

    def advanced(self, key: int, nbytes: int) -> None:
        pass

    def finished(self, key: int, status: str) -> None:
        pass

    def waiting(self, what: str, elapsed: float, done: bool) -> None:
        pass


class KnownBlobs(Protocol):
    """What this machine already knows of blobs by their digest (content, never a name): the
    result of reading a layer, or of a verified pair standing in for the read. `once` returns
    the layer's result, calling `read` only where no verified fact vouches for the manifest's
    digest and size and the config's diffID; it records what `read` found OK."""

    def once(
        self, index: int, desc: Descriptor, expected_diff_id: str, read: Callable[[], LayerResult]
    ) -> LayerResult: ...


def default_jobs() -> int:
    # Hashing and inflating release the GIL: one thread per core, a few more to hide network waits.
    return max(2, min(8, (os.cpu_count() or 2) + 2))


def _clip(d: str | None) -> str:
    return "?" if d is None else d if len(d) <= 20 else d[:19] + "…"


def judge_layer(
    index: int,
    desc: Descriptor,
    expected_diff_id: str | None,
    got: BlobDigests | None,
    *,
    foreign: bool = False,
    known_size: int | None = None,
) -> LayerResult:
    """The status of one layer from what was declared and what was computed."""
    base: _Declared = {
        "index": index,
        "media_type": desc.media_type,
        "expected_digest": desc.digest,
        "expected_size": desc.size,
        "expected_diff_id": expected_diff_id,
        "urls": desc.urls,
    }
    if got is None:
        if foreign or desc.foreign:
            where = f" (from {', '.join(desc.urls)})" if desc.urls else ""
            status = LayerStatus.FOREIGN
            detail = f"foreign (non-distributable) layer, not in the source{where}: not verified"
        else:
            status, detail = LayerStatus.MISSING, f"the source has no blob {desc.name}"
        return LayerResult(status=status, detail=detail, **base, **_NOTHING_READ)
    actual_size = known_size if got.too_long and known_size is not None else got.size
    values: _Read = {
        "compression": got.compression,
        "actual_digest": got.digest,
        "actual_size": actual_size,
        "actual_diff_id": got.diff_id,
        "uncompressed_size": got.uncompressed_size,
    }
    status, detail = _judge_read(desc, expected_diff_id, got, known_size, actual_size)
    return LayerResult(status=status, detail=detail, **base, **values)


class _Declared(TypedDict):
    """LayerResult's fields from the manifest and the config."""

    index: int
    media_type: str
    expected_digest: str | None
    expected_size: int | None
    expected_diff_id: str | None
    urls: tuple[str, ...]


class _Read(TypedDict):
    """LayerResult's fields from the blob's bytes."""

    compression: str | None
    actual_digest: str | None
    actual_size: int | None
    actual_diff_id: str | None
    uncompressed_size: int | None


_NOTHING_READ: _Read = {
    "compression": None,
    "actual_digest": None,
    "actual_size": None,
    "actual_diff_id": None,
    "uncompressed_size": None,
}


def _judge_read(
    desc: Descriptor, expected_diff_id: str | None, got: BlobDigests, known_size: int | None, actual_size: int
) -> tuple[LayerStatus, str]:
    """A blob that was read: its size, its digest, its inflation, then its diffID, in that order."""
    if desc.size is not None and (got.too_long or got.size != desc.size):
        longer = "more than " if got.too_long and known_size is None else ""
        why = "truncated" if not got.too_long else "longer than declared"
        return (
            LayerStatus.SIZE_MISMATCH,
            f"the blob is {longer}{actual_size} bytes, the manifest says {desc.size} ({why})",
        )
    if desc.digest is not None and got.digest != desc.digest:
        return (
            LayerStatus.DIGEST_MISMATCH,
            f"the blob hashes to {got.digest}, the manifest says {desc.digest}",
        )
    if got.decompress_error:
        return LayerStatus.DECOMPRESS_ERROR, got.decompress_error
    if expected_diff_id is None:
        return LayerStatus.DIFFID_MISMATCH, "the config lists no diffID for this layer"
    if got.diff_id != expected_diff_id:
        return (
            LayerStatus.DIFFID_MISMATCH,
            f"content differs: diffID {got.diff_id}, the config says {expected_diff_id}",
        )
    return LayerStatus.OK, ""


def check_config(
    desc: Descriptor, raw: bytes | None, official: str | None
) -> tuple[ConfigResult, JsonMapping, tuple[str, ...], list[str]]:
    """(result, parsed config, declared diffIDs, structural problems)."""
    if raw is None:
        res = ConfigResult(
            LayerStatus.MISSING, desc.digest, None, desc.size, None, official, "the config blob is missing"
        )
        return res, {}, (), []
    algorithm = (desc.digest or "sha256").partition(":")[0]
    actual = digest_of(raw, algorithm)
    status, detail = LayerStatus.OK, ""
    if desc.size is not None and len(raw) != desc.size:
        status, detail = (
            LayerStatus.SIZE_MISMATCH,
            f"the config is {len(raw)} bytes, the manifest says {desc.size}",
        )
    elif desc.digest is not None and actual != desc.digest:
        status, detail = (
            LayerStatus.DIGEST_MISMATCH,
            f"the config hashes to {actual}, the manifest says {desc.digest}",
        )
    if official is not None and actual != official and status is LayerStatus.OK:
        detail = f"the config digest {actual} is not the expected {official}"
    res = ConfigResult(status, desc.digest, actual, desc.size, len(raw), official, detail)
    problems: list[str] = []
    try:
        doc = untrusted_json.loads(raw, max_bytes=MAX_CONFIG_BYTES)
        diff_ids = _member(_member(doc, "rootfs"), "diff_ids")
        if not isinstance(diff_ids, list) or not all(isinstance(x, str) for x in diff_ids):
            raise TypeError("diff_ids is not a list of strings")
    except (ValueError, KeyError, TypeError) as e:
        problems.append(f"the config has no readable rootfs.diff_ids ({e})")
        return res, {}, (), problems
    return res, obj(doc), tuple(diff_ids), problems  # an object: _member read a key from it


def _member(value: object, key: str) -> object:
    """value[key]: a KeyError where the object has no such key, and where `value` is no object
    the TypeError indexing it raises (the problem reported names either, as it always did)."""
    if isinstance(value, dict):
        return value[key]
    return value[key]  # type: ignore[index]  # raises that TypeError: indexing is the check


def _count_problems(layers: int, diff_ids: int) -> list[str]:
    if layers != diff_ids:
        return [f"the manifest has {layers} layers but the config lists {diff_ids} diffIDs"]
    return []


def _platform(image: ResolvedImage, doc: JsonMapping) -> str | None:
    if image.platform:
        return image.platform
    parts = [doc.get("os"), doc.get("architecture"), doc.get("variant")]
    return "/".join(str(p) for p in parts if p) or None


def _report(
    source: str,
    image: ResolvedImage,
    config: ConfigResult,
    layers: list[LayerResult],
    diff_ids: tuple[str, ...],
    problems: list[str],
    doc: JsonMapping,
    source_wait_s: float | None = None,
) -> VerifyReport:
    return VerifyReport(
        source=source,
        manifest_media_type=image.manifest_media_type,
        manifest_digest=image.manifest_digest,
        index_digest=image.index_digest,
        platform=_platform(image, doc),
        config=config,
        layers=tuple(layers),
        diff_ids=diff_ids,
        problems=tuple(problems),
        source_wait_s=source_wait_s,
        config_doc=doc,
    )


def verify_source(
    source: Source,
    *,
    expect_config: str | None = None,
    jobs: int | None = None,
    max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED,
    progress: Progress | None = None,
    known: KnownBlobs | None = None,
) -> VerifyReport:
    """Verify every blob of the image `source` names. Raises SourceError (or another
    ImagegateError) when the image cannot be read; mismatches are in the report. With `known`,
    a layer whose manifest digest and size and config diffID a verified fact vouches for is not
    read again (an archive stream is read whole anyway)."""
    progress = progress or NoProgress()
    if isinstance(source, ArchiveStream):
        return _verify_stream(source, expect_config, max_uncompressed, progress)
    jobs = jobs or default_jobs()
    return _verify_random(source, expect_config, jobs, max_uncompressed, progress, known)


def read_config(source: ImageSource, desc: Descriptor) -> bytes | None:
    try:
        with source.open_blob(desc) as r:
            buf = io.BytesIO()
            while buf.tell() <= MAX_CONFIG_BYTES:
                chunk = r.read(1 << 20)
                if not chunk:
                    return buf.getvalue()
                buf.write(chunk)
    except BlobNotFound:
        return None
    raise SourceError(f"{source.description}: the config blob is larger than {MAX_CONFIG_BYTES} bytes")


def _verify_random(
    source: ImageSource,
    expect: str | None,
    jobs: int,
    max_uncompressed: int,
    progress: Progress,
    known: KnownBlobs | None = None,
) -> VerifyReport:
    image = source.resolve()
    config, doc, diff_ids, problems = check_config(image.config, read_config(source, image.config), expect)
    problems += _count_problems(len(image.layers), len(diff_ids))

    def one(i: int, desc: Descriptor) -> LayerResult:
        expected = diff_ids[i] if i < len(diff_ids) else None
        if known is None or expected is None:
            return read(i, desc, expected)
        return known.once(i, desc, expected, lambda: read(i, desc, expected))

    def read(i: int, desc: Descriptor, expected: str | None) -> LayerResult:
        label = f"layer {i + 1}/{len(image.layers)} {_clip(desc.digest or desc.locator)}"
        progress.started(i, label, desc.size if desc.size is not None else source.member_size(desc))
        log.debug("%s: reading %s", source.description, label)
        try:
            with source.open_blob(desc) as r:
                got = digest_blob(
                    r,
                    algorithm=(desc.digest or "sha256").partition(":")[0],
                    declared_size=desc.size,
                    max_uncompressed=max_uncompressed,
                    on_bytes=lambda n: progress.advanced(i, n),
                    what=f"{source.description}: the blob {desc.digest or desc.locator}",
                )
            seen = getattr(r, "size", None)
        except BlobNotFound:
            got, seen = None, None
        result = judge_layer(
            i, desc, expected, got, foreign=expected in image.foreign_diff_ids, known_size=seen
        )
        progress.finished(i, result.status.value)
        return result

    results: list[LayerResult] = []
    # Largest first: the biggest layer (a 10 GB `pip install` among twenty small ones) is the
    # critical path; queued behind the others it would start late and end alone.
    order = sorted(range(len(image.layers)), key=lambda i: -(image.layers[i].size or 0))
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="layer") as pool:
        started = {i: pool.submit(one, i, image.layers[i]) for i in order}
        futures: list[Future[LayerResult]] = [started[i] for i in range(len(image.layers))]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # an interrupt: no queued layer starts; running ones stop (interrupts.stop)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            for f in futures:
                f.cancel()  # queued layers are not read; running ones finish first
            failed.result()  # raises the worker's error
        results = [f.result() for f in futures]
    return _report(source.description, image, config, results, diff_ids, problems, doc)


_SMALL = 4 << 20  # members up to this size are read whole (metadata candidates)
_KEEP_TOTAL = 64 << 20  # at most this much metadata is kept in memory
_META_NAMES = ("manifest.json", "index.json", "oci-layout", "repositories")


@dataclass
class _StreamHashes:
    """What one pass over an archive stream leaves: every member hashed, the small ones that may
    be metadata kept, and the hard links between members."""

    kept: dict[str, bytes] = field(default_factory=dict)
    kept_total: int = 0
    digests: dict[str, BlobDigests] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    waited: float | None = None  # how long the stream took to start, when it was waited for

    def follow(self, name: str) -> str:
        for _ in range(16):
            if name not in self.links:
                return name
            name = self.links[name]
        return name


def _hash_members(archive: ArchiveStream, max_uncompressed: int, progress: Progress) -> _StreamHashes:
    got = _StreamHashes()
    lock = threading.Lock()  # progress sinks may expect calls from one thread at a time

    def waiting(elapsed: float, done: bool) -> None:
        if done and got.waited is None:
            got.waited = round(elapsed, 1)
        with lock:
            progress.waiting(archive.description, elapsed, done)

    with archive.members(waiting) as members:
        for k, m in enumerate(members):
            if m.link_target is not None:
                got.links[m.name] = m.link_target
                continue
            algorithm = (
                m.name.split("/")[1] if m.name.startswith("blobs/") and m.name.count("/") == 2 else "sha256"
            )
            if algorithm not in ("sha256", "sha512"):
                algorithm = "sha256"
            got.sizes[m.name] = m.size
            if m.size <= _SMALL:
                data = m.reader.read(m.size)
                looks_meta = m.name in _META_NAMES or m.name.endswith(".json") or data[:1] == b"{"
                if looks_meta and got.kept_total + len(data) <= _KEEP_TOTAL:
                    got.kept[m.name] = data
                    got.kept_total += len(data)
                got.digests[m.name] = digest_blob(
                    io.BytesIO(data), algorithm=algorithm, max_uncompressed=max_uncompressed
                )
                continue
            with lock:
                progress.started(k, m.name, m.size)
            got.digests[m.name] = digest_blob(
                m.reader,
                algorithm=algorithm,
                max_uncompressed=max_uncompressed,
                on_bytes=lambda n, k=k: progress.advanced(k, n),  # type: ignore[misc]
                what=f"{archive.description}: {m.name}",
            )
            progress.finished(k, "hashed")
    return got


def _verify_stream(
    archive: ArchiveStream, expect: str | None, max_uncompressed: int, progress: Progress
) -> VerifyReport:
    got = _hash_members(archive, max_uncompressed, progress)
    kept, follow = got.kept, got.follow
    image = resolve_archive(
        lambda n: kept.get(follow(n)),
        wanted=archive.wanted,
        platform=archive.platform,
        source=archive.description,
    )
    config_name = follow(image.config.locator or blob_path(image.config.digest or ""))
    config, doc, diff_ids, problems = check_config(image.config, kept.get(config_name), expect)
    problems += _count_problems(len(image.layers), len(diff_ids))
    results = []
    for i, desc in enumerate(image.layers):
        name = follow(desc.locator or (blob_path(desc.digest) if desc.digest else ""))
        expected = diff_ids[i] if i < len(diff_ids) else None
        results.append(
            judge_layer(
                i,
                desc,
                expected,
                got.digests.get(name),
                foreign=expected in image.foreign_diff_ids,
                known_size=got.sizes.get(name),
            )
        )
    return _report(archive.description, image, config, results, diff_ids, problems, doc, got.waited)
