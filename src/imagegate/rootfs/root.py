"""What an unpacked image is (`Root`), the bounds on unpacking, and the errors that refuse one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from imagegate._support.jsontypes import JsonMapping
from imagegate.errors import ImagegateError
from imagegate.oci.hashing import DEFAULT_MAX_UNCOMPRESSED
from imagegate.oci.layercheck import VerifyReport

# Every layer together: four of the largest layers seen in practice.
DEFAULT_MAX_TOTAL = 4 * DEFAULT_MAX_UNCOMPRESSED


@dataclass(frozen=True)
class Limits:
    """Bounds on the uncompressed bytes written (decompression bombs)."""

    max_layer_bytes: int = DEFAULT_MAX_UNCOMPRESSED
    max_total_bytes: int = DEFAULT_MAX_TOTAL


@dataclass(frozen=True)
class Root:
    """An image's verified root filesystem, unpacked in the cache. Use `path` read-only: it
    is shared with later runs of the same image."""

    path: str  # the root folder
    chain_id: str  # OCI chainID of the layers (the cache key)
    config_digest: str
    manifest_digest: str | None  # of the source read this time; None for a legacy docker save
    env: tuple[str, ...]
    working_dir: str
    user: str
    entrypoint: tuple[str, ...] | None
    cmd: tuple[str, ...] | None
    report: VerifyReport  # this source's config check; the layers' results from the unpack
    not_applied: tuple[str, ...] = ()  # what the runner's privileges did not allow
    size: int = 0  # uncompressed bytes of the layers' files
    cached: bool = False  # reused from the cache: its layers were verified when it was unpacked
    unpacked_from: str = ""  # the source it was unpacked from


def chain_id(diff_ids: Sequence[str]) -> str:
    """The OCI chainID: ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln)).
    An image without layers (an empty root) is keyed by the sha256 of nothing."""
    if not diff_ids:
        return "sha256:" + hashlib.sha256(b"").hexdigest()
    chain = diff_ids[0]
    for d in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {d}".encode()).hexdigest()
    return chain


def layer_label(i: int, n: int, digest: str | None) -> str:
    """`layer 2/3 sha256:0123456789ab…`: how a refusal names a layer."""
    d = digest or "?"
    return f"layer {i + 1}/{n} {d[:19] + '…' if len(d) > 20 else d}"


class ImageSettings(TypedDict):
    """What of an image config a Root keeps (its fields of the same names)."""

    env: tuple[str, ...]
    working_dir: str
    user: str
    entrypoint: tuple[str, ...] | None
    cmd: tuple[str, ...] | None


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return tuple(value)
    return None


def image_settings(doc: JsonMapping) -> ImageSettings:
    """Env, WorkingDir, User, Entrypoint and Cmd of an image config (absent ones empty)."""
    cfg = doc.get("config")
    cfg = cfg if isinstance(cfg, dict) else {}
    wd, user = cfg.get("WorkingDir"), cfg.get("User")
    return {
        "env": _strings(cfg.get("Env")) or (),
        "working_dir": wd if isinstance(wd, str) else "",
        "user": user if isinstance(user, str) else "",
        "entrypoint": _strings(cfg.get("Entrypoint")),
        "cmd": _strings(cfg.get("Cmd")),
    }


class UnpackError(ImagegateError):
    """The image's root could not be made; nothing of it was kept. `layer` (0-based) and
    `entry` name where, when known; `report` holds the verification results so far."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        layer: int | None = None,
        entry: str | None = None,
        report: VerifyReport | None = None,
    ):
        super().__init__(message, hint=hint)
        self.layer, self.entry, self.report = layer, entry, report


class ImageRefused(UnpackError):
    """The image failed verification or holds hostile content: rejected (exit 1)."""

    exit_code = 1


class ConfigRefused(ImageRefused):
    """The config does not match the manifest, --expect-config, or its own layer count."""


class LayerRefused(ImageRefused):
    """A layer's bytes are not the ones declared (digest, size, diffID, corrupt, missing)."""


class HostileLayer(ImageRefused):
    """A layer entry that would write outside the root, or past the bound on bytes."""
