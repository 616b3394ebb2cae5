"""An image built FROM scratch (one layer: busybox, no /proc, /dev, /sys or /tmp), pulled from a
registry and unpacked by the rootfs driver's own code, runs in the sandbox with the mount points
an engine gives; the root cache's verified content is left as the layer made it."""

from __future__ import annotations

from pathlib import Path

from imagegate.oci.transports import open_source
from imagegate.rootfs import RootCache, materialize
from tests.drivers.test_sandbox import assert_engine_mount_points
from tests.oci.infra import Registry
from tests.rootfs.infra import BUSYBOX, Entry, layer_tar, push_layers


def test_a_from_scratch_image_runs_with_an_engine_s_mount_points(
    registry: Registry, cache: RootCache, tmp_path: Path
) -> None:
    layer = layer_tar(
        [
            Entry("bin", "dir", mode=0o755),
            Entry("bin/busybox", data=BUSYBOX.read_bytes(), mode=0o755),
            Entry("bin/sh", "symlink", link="busybox"),
        ]
    )
    src = push_layers(registry, tmp_path, "scratch", [layer])
    root = materialize(open_source(src), cache=cache)
    assert sorted(p.name for p in Path(root.path).iterdir()) == ["bin"]
    assert_engine_mount_points(Path(root.path))
    assert sorted(p.name for p in Path(root.path).iterdir()) == ["bin"]
