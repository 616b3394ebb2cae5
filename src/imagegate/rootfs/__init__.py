"""An image's root filesystem without an engine: every layer verified (digest, size, diffID)
while it is applied to a folder, following the OCI image spec's layer rules, and kept in a
bounded cache keyed by the image's chainID.

    from imagegate.rootfs import RootCache, materialize
    with RootCache(folder, max_bytes) as cache:
        root = materialize(open_source("docker://..."), cache=cache)
        root.path  # the verified root, read-only use
"""

from imagegate.rootfs.cache import CacheEntry, RootCache, default_folder
from imagegate.rootfs.root import (
    ConfigRefused,
    HostileLayer,
    ImageRefused,
    LayerRefused,
    Limits,
    Root,
    UnpackError,
    chain_id,
)
from imagegate.rootfs.unpack import materialize

__all__ = [
    "CacheEntry",
    "ConfigRefused",
    "HostileLayer",
    "ImageRefused",
    "LayerRefused",
    "Limits",
    "Root",
    "RootCache",
    "UnpackError",
    "chain_id",
    "default_folder",
    "materialize",
]
