"""What `imagegate cache` prints: an unpacked root, the cached roots, what a prune removed (the
JSON forms beside the text)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console

from imagegate._support.jsontypes import JsonObject
from imagegate._support.sizes import gib

if TYPE_CHECKING:
    from imagegate.rootfs import CacheEntry, Root


def root_json(root: Root) -> JsonObject:
    return {
        "path": root.path,
        "chain_id": root.chain_id,
        "config_digest": root.config_digest,
        "manifest_digest": root.manifest_digest,
        "cached": root.cached,
        "size": root.size,
        "not_applied": list(root.not_applied),
        "verification": root.report.to_dict(),
    }


def render_root(root: Root, out: Console) -> None:
    how = (
        "reused from the cache" if root.cached else f"{len(root.report.layers)} layers verified and unpacked"
    )
    out.print(f"{root.path}\n  chainID {root.chain_id}, config {root.config_digest}, {gib(root.size)}: {how}")
    for note in root.not_applied:
        out.print(f"  not applied: {note}")


def entries_json(folder: str, entries: Sequence[CacheEntry]) -> JsonObject:
    return {"folder": folder, "roots": [dataclasses.asdict(e) for e in entries]}


def render_entries(folder: str, entries: Sequence[CacheEntry], out: Console) -> None:
    for entry in entries:
        used = datetime.datetime.fromtimestamp(entry.last_used).isoformat(timespec="seconds")
        busy = "  (in use)" if entry.in_use else ""
        out.print(f"{entry.chain_id}  {gib(entry.size)}  used {used}  from {entry.unpacked_from}{busy}")
    out.print(f"{len(entries)} roots, {gib(sum(x.size for x in entries))} in {folder}")


def render_pruned(removed: Sequence[CacheEntry], left: int) -> None:
    for entry in removed:
        print(f"removed {entry.chain_id} ({gib(entry.size)})")
    print(f"{len(removed)} roots removed; {gib(left)} left")
