"""A mirror set (`mirror_sets:` of an inventory) as the (official, mirror) pairs it names: the tags
of a mirrored repository, or of every repository the registry's catalog lists under a namespace,
each paired with the official image its pattern names. Listings are untrusted answers, bounded
(oci/registry.py: names, pages, bytes); names that are not valid tags or repositories are skipped,
said. A registry that lists nothing (catalog or tag listing disabled, or denied) is an error that
names the set and says to list the tags."""

from __future__ import annotations

import fnmatch
import re

from imagegate.errors import UsageError
from imagegate.oci.reference import parse_reference
from imagegate.oci.registry import RegistryClient, RegistryError
from imagegate.usecases.audit.imagelist import MirrorEntry, MirrorSet

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # the distribution spec's tag grammar
_REPOSITORY = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_PATTERN = frozenset("*?[")


def _plain(tags: list[str]) -> bool:
    return not any(_PATTERN & set(t) for t in tags)


def expand(ms: MirrorSet, skipped: list[str], client: RegistryClient | None = None) -> list[MirrorEntry]:
    """The pairs `ms` names, in listing order; names refused are added to `skipped`. Raises
    RegistryError where a listing it needs cannot be read, UsageError where it names nothing."""
    namespace = ms.mirror.endswith("/*")
    ref = parse_reference(ms.mirror[:-2] if namespace else ms.mirror)
    client = client or RegistryClient(ref.endpoint, insecure=ms.insecure)
    if namespace:
        prefix = ref.repository + "/"
        try:
            listed = client.catalog()
        except RegistryError as e:
            raise RegistryError(
                f"mirror set {ms.name or ms.mirror}: the registry's catalog could not be read ({e})",
                hint="catalog listing is often disabled: name the repositories, one mirror set each",
            ) from e
        repos = [(r, r[len(prefix) :]) for r in listed if r.startswith(prefix)]
    else:
        repos = [(ref.repository, ref.repository.rsplit("/", 1)[-1])]
    pairs: list[MirrorEntry] = []
    for repo, rel in repos:
        if not _REPOSITORY.match(repo):
            skipped.append(f"{ref.registry}/{repo}: not a repository name")
            continue
        for tag in _tags(ms, client, repo, skipped):
            official = ms.official.replace("{repository}", rel).replace("{tag}", tag)
            pairs.append(
                MirrorEntry(
                    official=official,
                    mirror=f"docker://{ref.registry}/{repo}:{tag}",
                    name=f"{repo}:{tag}",
                    deep=ms.deep,
                    platform=ms.platform,
                    insecure=ms.insecure,
                )
            )
    if not pairs:
        raise UsageError(
            f"mirror set {ms.name or ms.mirror}: names no image (no repository or tag matched)",
            hint="check the mirror's namespace and the tags: patterns",
        )
    return pairs


def _tags(ms: MirrorSet, client: RegistryClient, repo: str, skipped: list[str]) -> list[str]:
    if ms.tags is not None and _plain(ms.tags):
        return list(dict.fromkeys(ms.tags))  # no listing needed: a registry with listing off
    try:
        listed = client.list_tags(repo)
    except RegistryError as e:
        raise RegistryError(
            f"mirror set {ms.name or ms.mirror}: the tags of {repo} could not be listed ({e})",
            hint="tag listing may be disabled: name the tags (tags: [v1, v2]) in the inventory",
        ) from e
    tags = []
    for tag in dict.fromkeys(listed):
        if not _TAG.match(tag):
            skipped.append(f"{repo}: {tag[:80]!r} is not a tag")
        elif ms.tags is None or any(fnmatch.fnmatchcase(tag, p) for p in ms.tags):
            tags.append(tag)
    return tags
