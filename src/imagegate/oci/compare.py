"""Is the mirror the official image? Exact in what it claims: equal manifest digests mean
identical blobs; an equal config digest with every diffID recomputed means the same content
(compressed blobs may still differ: different compression); anything else is a different image,
with the layers and config fields that differ."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from imagegate._support.jsontypes import JsonMapping, JsonObject
from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED
from imagegate.oci.hashing import DEFAULT_MAX_UNCOMPRESSED
from imagegate.oci.layercheck import (
    KnownBlobs,
    LayerStatus,
    Progress,
    VerifyReport,
    check_config,
    read_config,
    verify_source,
)
from imagegate.oci.sources.interface import ArchiveStream, ImageSource, Source, SourceError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # in typing from 3.11; imagegate runs on 3.10 too

COMPARED_BLOBS = "manifests and layer blobs"
COMPARED_LAYERS = "uncompressed layers"  # a docker save archive or engine export has no registry blobs


class Verdict(str, enum.Enum):
    IDENTICAL = "IDENTICAL"  # same manifest digest: byte-identical blobs
    SAME_CONTENT = "SAME_CONTENT"  # same config, every diffID verified; compression may differ
    DIFFERENT = "DIFFERENT"  # another config: another image
    CORRUPT = "CORRUPT"  # same config declared, but a blob does not match it

    def __str__(self) -> str:
        return self.value


# The runtime settings users care about, as (name, path in the config document).
CONFIG_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("env", ("config", "Env")),
    ("entrypoint", ("config", "Entrypoint")),
    ("cmd", ("config", "Cmd")),
    ("labels", ("config", "Labels")),
    ("user", ("config", "User")),
    ("workdir", ("config", "WorkingDir")),
)


@dataclass(frozen=True)
class FieldDiff:
    field: str
    official: object  # a value of the config (JSON), or the platform's name
    mirror: object


@dataclass(frozen=True)
class LayerDiff:
    index: int
    official_diff_id: str | None
    mirror_diff_id: str | None


@dataclass(frozen=True)
class ComparedImage:
    source: str
    manifest_digest: str | None
    config_digest: str | None  # computed from the config's bytes
    layer_digests: tuple[str | None, ...]  # compressed digests, as the manifest names them
    diff_ids: tuple[str, ...]
    config_doc: JsonMapping
    report: VerifyReport | None = None  # when its blobs were read


@dataclass(frozen=True)
class CompareResult:
    verdict: Verdict
    sentence: str
    official: ComparedImage
    mirror: ComparedImage
    layer_diffs: tuple[LayerDiff, ...] = ()
    field_diffs: tuple[FieldDiff, ...] = ()
    other_fields: tuple[str, ...] = ()  # other config keys that differ (created, history, ...)
    compressed_differ: int = 0
    problems: tuple[str, ...] = ()  # failed layers, named
    compared: str = "manifests"  # what was compared: manifests, blobs, or uncompressed layers

    @property
    def exit_code(self) -> int:
        return EXIT_ACCEPTED if self.verdict in (Verdict.IDENTICAL, Verdict.SAME_CONTENT) else EXIT_REJECTED

    def to_dict(self) -> JsonObject:
        def side(s: ComparedImage) -> JsonObject:
            return {
                "source": s.source,
                "manifest_digest": s.manifest_digest,
                "config_digest": s.config_digest,
                "diff_ids": list(s.diff_ids),
                "verification": s.report.to_dict() if s.report else None,
            }

        return {
            "verdict": self.verdict.value,
            "sentence": self.sentence,
            "exit_code": self.exit_code,
            "official": side(self.official),
            "mirror": side(self.mirror),
            "layer_diffs": [vars(d) for d in self.layer_diffs],
            "config_field_diffs": [json.loads(json.dumps(vars(d), default=str)) for d in self.field_diffs],
            "other_config_fields": list(self.other_fields),
            "compressed_digests_differ": self.compressed_differ,
            "compared": self.compared,
            "problems": list(self.problems),
        }


def _get(doc: JsonMapping, path: tuple[str, ...]) -> object:
    cur: object = doc
    for key in path:
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    # Converters (docker -> OCI config) drop empty fields: "" and null mean the same to a runtime.
    return None if cur in ("", [], {}) else cur


def _platform(doc: JsonMapping) -> str:
    return "/".join(str(doc[k]) for k in ("os", "architecture", "variant") if doc.get(k))


def config_differences(a: JsonMapping, b: JsonMapping) -> tuple[list[FieldDiff], list[str]]:
    """The listed runtime fields that differ, then the names of other differing keys."""
    diffs = [
        FieldDiff(name, _get(a, path), _get(b, path))
        for name, path in CONFIG_FIELDS
        if _get(a, path) != _get(b, path)
    ]
    if _platform(a) != _platform(b):
        diffs.append(FieldDiff("platform", _platform(a), _platform(b)))
    known = {("config", p[1]) for _, p in CONFIG_FIELDS} | {
        ("os",),
        ("architecture",),
        ("variant",),
        ("rootfs",),
    }
    others: list[str] = []
    for key in sorted(set(a) | set(b)):
        in_a, in_b = a.get(key), b.get(key)
        if key == "config" and isinstance(in_a, Mapping) and isinstance(in_b, Mapping):
            for sub in sorted(set(in_a) | set(in_b)):
                if ("config", sub) not in known and in_a.get(sub) != in_b.get(sub):
                    others.append(f"config.{sub}")
        elif (key,) not in known and in_a != in_b:
            others.append(key)
    return diffs, others


class _VerifyOptions(TypedDict):
    """What compare passes on to verify_source for each side it reads."""

    jobs: int | None
    max_uncompressed: int
    progress: Progress | None
    known: KnownBlobs | None


def _side(source: Source, *, read_blobs: bool, **verify_kw: Unpack[_VerifyOptions]) -> ComparedImage:
    """One image's identity; its blobs are read (and verified) when asked, or when the source
    can only be read whole (an archive stream)."""
    if isinstance(source, ArchiveStream) or read_blobs:
        r = verify_source(source, **verify_kw)
        digests = tuple(x.expected_digest for x in r.layers)
        return ComparedImage(
            r.source, r.manifest_digest, r.config.actual_digest, digests, r.diff_ids, r.config_doc, r
        )
    image = source.resolve()
    config, doc, diff_ids, _ = check_config(image.config, read_config(source, image.config), None)
    digests = tuple(d.digest for d in image.layers)
    return ComparedImage(
        source.description, image.manifest_digest, config.actual_digest, digests, diff_ids, doc
    )


def _named_failures(r: VerifyReport) -> list[str]:
    out = (
        [f"{r.source}: config {r.config.status}: {r.config.detail}"]
        if r.config.status is not LayerStatus.OK
        else []
    )
    out += [
        f"{r.source}: layer {x.index + 1} ({x.expected_digest or x.expected_diff_id}) {x.status}: {x.detail}"
        for x in r.failed_layers
    ]
    out += [f"{r.source}: {p}" for p in r.problems]
    return out


def compare(
    official: Source,
    mirror: Source,
    *,
    deep: bool = False,
    jobs: int | None = None,
    max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED,
    progress: Progress | None = None,
    known: KnownBlobs | None = None,
) -> CompareResult:
    """The verdict about the two images. Each source is resolved once (a registry tag to the
    digest it names then) and read by that digest after; the manifests named in the result are
    the ones whose bytes were compared. A tag that names another manifest when asked again at
    the end raises ReferenceMoved (exit 2): the verdict would be about bytes it no longer names.
    `known`: blobs verified before stand in for reading them again (layercheck.KnownBlobs)."""
    kw: _VerifyOptions = {
        "jobs": jobs,
        "max_uncompressed": max_uncompressed,
        "progress": progress,
        "known": known,
    }
    result = _compare(official, mirror, deep, kw)
    for source in (official, mirror):
        if isinstance(source, ImageSource):
            source.confirm_unmoved()
    return result


def _compare(official: Source, mirror: Source, deep: bool, kw: _VerifyOptions) -> CompareResult:
    # Step 1: manifests only (no blob read) where the source allows it.
    if not deep and isinstance(official, ImageSource) and isinstance(mirror, ImageSource):
        o_img, m_img = official.resolve(), mirror.resolve()
        if o_img.manifest_digest and o_img.manifest_digest == m_img.manifest_digest:
            o = ComparedImage(official.description, o_img.manifest_digest, o_img.config.digest, (), (), {})
            m = ComparedImage(mirror.description, m_img.manifest_digest, m_img.config.digest, (), (), {})
            return CompareResult(
                Verdict.IDENTICAL,
                f"identical: manifest digest equal ({o_img.manifest_digest}); no blob read",
                o,
                m,
            )
    o = _side(official, read_blobs=deep, **kw)
    m = _side(mirror, read_blobs=False, **kw)
    if o.config_digest is not None and o.config_digest == m.config_digest:
        return _same_config(o, mirror, m, deep, kw)
    return _different(o, m, mirror, deep, kw)


def _blobs_of(mirror: Source, first: ComparedImage, kw: _VerifyOptions) -> ComparedImage:
    """The mirror read again, its blobs this time: the very image compared first (its source
    pinned it), or a SourceError where the source answered another one."""
    again = _side(mirror, read_blobs=True, **kw)
    if (again.manifest_digest, again.config_digest) != (first.manifest_digest, first.config_digest):
        raise SourceError(
            f"{mirror.description}: named manifest {first.manifest_digest} (config "
            f"{first.config_digest}) when first read and {again.manifest_digest} (config "
            f"{again.config_digest}) when its blobs were read: it changed between reads; nothing "
            "was concluded",
            hint="name the image by its digest (or a file that does not change) and run again",
        )
    return again


def _same_config(
    o: ComparedImage, mirror: Source, m: ComparedImage, deep: bool, kw: _VerifyOptions
) -> CompareResult:
    if m.report is None:
        m = _blobs_of(mirror, m, kw)
    assert m.report is not None
    failures = _named_failures(m.report) + (_named_failures(o.report) if o.report else [])
    n = len(m.report.layers)
    verified = m.report.verified
    if failures:
        return CompareResult(
            Verdict.CORRUPT,
            f"corrupt: config digest equal, but {len(failures)} problem(s): " + "; ".join(failures),
            o,
            m,
            problems=tuple(failures),
            compared=COMPARED_BLOBS,
        )
    foreign = m.report.foreign
    tail = f" ({foreign} foreign layers not verified)" if foreign else ""
    head = f"same content: config digest equal, {verified}/{n} diffIDs verified{tail}"
    return _same_content(o, m, head, tail, verified, n)


def _same_content(
    o: ComparedImage, m: ComparedImage, head: str, tail: str, verified: int, n: int
) -> CompareResult:
    """Same config, every diffID verified: what the compressed blobs and manifests add to it."""
    # A docker save archive (and the engine's export) has no registry blobs: a legacy one
    # declares no layer digest at all, an OCI one holds the layers uncompressed. Comparing its
    # blobs with a registry's compressed ones says nothing: only the uncompressed layers compare.
    undeclared = _names(s for s in (o, m) if not s.layer_digests or None in s.layer_digests)
    if undeclared:
        what = "is a docker save archive" if len(undeclared) == 1 else "are docker save archives"
        return CompareResult(
            Verdict.SAME_CONTENT,
            f"{head}; compared uncompressed layers: {' and '.join(undeclared)} {what} with no "
            "registry blobs (no compressed digests) to compare",
            o,
            m,
            compared=COMPARED_LAYERS,
        )
    # Positions beyond the shorter list count as differing.
    pairs = zip(o.layer_digests, m.layer_digests, strict=False)
    differ = sum(1 for a, b in pairs if a != b) + abs(len(o.layer_digests) - len(m.layer_digests))
    if differ:
        exported = _names(s for s in (o, m) if _uncompressed(s))
        if exported:
            what = "holds its layers" if len(exported) == 1 else "hold their layers"
            sentence = (
                f"{head}; compared uncompressed layers: {' and '.join(exported)} {what} uncompressed "
                "(as docker save writes them), not as a registry's compressed blobs"
            )
            return CompareResult(Verdict.SAME_CONTENT, sentence, o, m, compared=COMPARED_LAYERS)
        sentence = (
            f"{head}; compressed digests differ for {differ} layers (different compression); "
            "blobs are not byte-identical"
        )
    elif o.manifest_digest and o.manifest_digest == m.manifest_digest:
        return CompareResult(
            Verdict.IDENTICAL,
            f"identical: manifest digest equal ({m.manifest_digest}), {verified}/{n} diffIDs verified{tail}",
            o,
            m,
        )
    else:
        sentence = (
            f"{head}; layer digests equal for all {n} layers (byte-identical blobs); the manifests "
            f"differ ({o.manifest_digest or 'none'} vs {m.manifest_digest or 'none'})"
        )
    return CompareResult(
        Verdict.SAME_CONTENT, sentence, o, m, compressed_differ=differ, compared=COMPARED_BLOBS
    )


def _layers_read(o: ComparedImage, m: ComparedImage) -> str:
    """Where the diffIDs compared come from: equal diffIDs in two configs say nothing about the
    layers' bytes unless those were read and hashed."""
    unread = [s for s in (o, m) if s.report is None]
    if not unread:
        return "recomputed from the layers' bytes"
    if len(unread) == 2:
        return "as the configs list them; no layer read"
    return f"as the configs list them; only the layers of {_names(s for s in (o, m) if s.report)[0]} read"


def _uncompressed(side: ComparedImage) -> bool:
    """Its layer blobs are the uncompressed tars (digest = diffID), as `docker save` writes them."""
    return bool(side.layer_digests) and tuple(side.layer_digests) == tuple(side.diff_ids)


def _names(sides: Iterable[ComparedImage]) -> list[str]:
    return list(dict.fromkeys(s.source for s in sides))


def _different(
    o: ComparedImage, m: ComparedImage, mirror: Source, deep: bool, kw: _VerifyOptions
) -> CompareResult:
    if deep and m.report is None:
        m = _blobs_of(mirror, m, kw)
    layer_diffs = [
        LayerDiff(i, a, b)
        for i, (a, b) in enumerate(
            [
                (
                    o.diff_ids[i] if i < len(o.diff_ids) else None,
                    m.diff_ids[i] if i < len(m.diff_ids) else None,
                )
                for i in range(max(len(o.diff_ids), len(m.diff_ids)))
            ]
        )
        if a != b
    ]
    fields, others = config_differences(o.config_doc, m.config_doc)
    n = max(len(o.diff_ids), len(m.diff_ids))
    parts = [f"different image: config digests differ ({o.config_digest} vs {m.config_digest})"]
    read = _layers_read(o, m)
    if layer_diffs:
        parts.append(
            f"diffIDs differ for {len(layer_diffs)} of {n} layers: "
            + ", ".join(str(d.index + 1) for d in layer_diffs)
            + f" ({read})"
        )
    else:
        parts.append(f"all {n} diffIDs equal ({read})")
    if fields:
        parts.append("config fields that differ: " + ", ".join(f.field for f in fields))
    else:
        parts.append("env, entrypoint, cmd, labels, user, workdir, platform equal")
    if others:
        parts.append("other config keys differ: " + ", ".join(others))
    failures = []
    for r in (o.report, m.report):
        if r is not None:
            failures += _named_failures(r)
    if failures:
        parts.append("corrupt blobs: " + "; ".join(failures))
    return CompareResult(
        Verdict.DIFFERENT,
        "; ".join(parts),
        o,
        m,
        layer_diffs=tuple(layer_diffs),
        field_diffs=tuple(fields),
        other_fields=tuple(others),
        problems=tuple(failures),
        compared="configs and diffIDs",
    )
