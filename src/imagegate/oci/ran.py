"""Which manifest an engine ran. An engine names an image by its config digest (the image ID)
and by the digests it was pulled by (RepoDigests); for an image pulled through a
multi-platform index those name the index, which admission reads as covering every platform.
An acceptance is about what ran: the registry's copy of each repo digest is read (every
manifest hashed to its digest) and the manifest whose config digest is the image ID is the
one; the index it was listed in is recorded beside it, never in its place. Platform fields only
order the search: the config digest is the proof."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from imagegate._support.deadline import DeadlineReached
from imagegate.domain.digest import short_digest
from imagegate.errors import ImagegateError
from imagegate.oci.manifest import (
    MANIFEST_TYPES,
    Descriptor,
    Index,
    Manifest,
    Platform,
    parse_manifest,
    platform_matches,
)
from imagegate.oci.reference import parse_reference

if TYPE_CHECKING:
    from imagegate.oci.registry import RegistryClient

MAX_REPO_DIGESTS = 4  # an image pulled from, or pushed to, more registries than this is rare
MAX_INDEX_ENTRIES = 64  # manifests of one index read while looking for the config
REGISTRY_RETRIES = 1  # an unreachable registry is said in the statement, not waited for


@dataclass(frozen=True)
class RanManifest:
    """`manifest_digest`: the manifest whose config ran (None: none was found, `why` says why);
    `index_digest`: the index it was chosen from (or, when none matched, the index read);
    `repository`: `registry/repository` of the repo digest that led to it."""

    repository: str | None
    manifest_digest: str | None
    index_digest: str | None = None
    why: str | None = None


def ran_manifest(
    repo_digests: Sequence[str],
    config_digest: str,
    *,
    named: str | None = None,
    platform: Platform | None = None,
    insecure: bool = False,
) -> RanManifest:
    """The manifest among `repo_digests` (`registry/repository@digest`, as engines list them)
    whose config is `config_digest`: a repo digest of the repository `named` first, then the
    others. A repo digest that names an index is searched entry by entry, `platform`'s first."""
    candidates = _ordered(repo_digests, named)[:MAX_REPO_DIGESTS]
    if not candidates:
        return RanManifest(None, None)
    notes: list[str] = []
    index_seen = None
    for repository, digest in candidates:
        try:
            found = _search(repository, digest, config_digest, platform, insecure)
        except DeadlineReached:
            raise
        except ImagegateError as e:
            notes.append(f"{repository}@{short_digest(digest)} could not be read: {e}")
            continue
        if found.manifest_digest is not None:
            return found if found.index_digest else _listed_by(found, candidates, insecure)
        index_seen = index_seen or found.index_digest
        notes.append(str(found.why))
    why = (
        f"no manifest the engine knows the image by has its config {short_digest(config_digest)}: "
        + "; ".join(notes)
    )
    return RanManifest(candidates[0][0], None, index_seen, why)


def _listed_by(found: RanManifest, candidates: list[tuple[str, str]], insecure: bool) -> RanManifest:
    """`found` with the index among the other repo digests of its repository that lists it
    (Podman lists an image pulled through an index by both digests)."""
    for repository, digest in candidates:
        if repository != found.repository or digest == found.manifest_digest:
            continue
        ref = parse_reference(f"{repository}@{digest}")
        try:
            with _client(ref.endpoint, insecure) as client:
                top = client.get_manifest(ref.repository, digest)
            doc = parse_manifest(top.raw, top.media_type, f"{repository}@{digest}")
        except DeadlineReached:
            raise
        except ImagegateError:
            continue  # the manifest stands on its own; only the index is not recorded
        if isinstance(doc, Index) and any(d.digest == found.manifest_digest for d in doc.manifests):
            return replace(found, index_digest=digest)
    return found


def _ordered(repo_digests: Sequence[str], named: str | None) -> list[tuple[str, str]]:
    """(repository, digest) pairs, those of the repository `named` first (names compared as a
    registry client resolves them: `python` is docker.io/library/python)."""

    def key(repository: str) -> tuple[str, str] | None:
        try:
            ref = parse_reference(repository)
        except ImagegateError:
            return None
        return ref.registry, ref.repository

    wanted = key(named) if named else None
    pairs = []
    for text in repo_digests:
        repository, _, digest = text.partition("@")
        if repository and digest:
            pairs.append((repository, digest))
    return sorted(pairs, key=lambda p: wanted is None or key(p[0]) != wanted)


def _search(
    repository: str, digest: str, config_digest: str, platform: Platform | None, insecure: bool
) -> RanManifest:
    ref = parse_reference(f"{repository}@{digest}")
    where = f"{repository}@{digest}"
    with _client(ref.endpoint, insecure) as client:
        top = client.get_manifest(ref.repository, digest)  # hashed: the bytes are the digest's
        doc = parse_manifest(top.raw, top.media_type, where)
        if isinstance(doc, Manifest):
            if doc.config.digest == config_digest:
                return RanManifest(repository, digest)
            return RanManifest(
                repository,
                None,
                why=f"the manifest {short_digest(digest)} has config {short_digest(str(doc.config.digest))}",
            )
        entries = _entries(doc, platform)
        for entry in entries[:MAX_INDEX_ENTRIES]:
            assert entry.digest is not None  # an index entry always has one (parse_manifest)
            child = client.get_manifest(ref.repository, entry.digest)
            got = parse_manifest(child.raw, child.media_type or entry.media_type, f"{where} entry")
            if isinstance(got, Manifest) and got.config.digest == config_digest:
                return RanManifest(repository, entry.digest, index_digest=digest)
    read = min(len(entries), MAX_INDEX_ENTRIES)
    return RanManifest(
        repository,
        None,
        index_digest=digest,
        why=f"none of the {read} manifests read of the index {short_digest(digest)} has it",
    )


def _client(endpoint: str, insecure: bool) -> RegistryClient:
    from imagegate.oci.registry import RegistryClient  # here: an image with no registry never loads httpx

    return RegistryClient(endpoint, insecure=insecure, retries=REGISTRY_RETRIES)


def _entries(index: Index, platform: Platform | None) -> list[Descriptor]:
    """The index's image manifests (nested indexes are not followed), the platform's first."""
    manifests = [d for d in index.manifests if not d.media_type or d.media_type in MANIFEST_TYPES]

    def other(d: Descriptor) -> bool:
        return platform is None or d.platform is None or not platform_matches(platform, d.platform)

    return sorted(manifests, key=other)
