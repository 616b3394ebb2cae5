"""The kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go), step for step, in Python: how a
ConfigMap volume is written and updated on a node. Tests use it to update a mounted bundle while
a controller run is in progress, exactly as a `kubectl apply` of a changed ConfigMap would.

    <target>/imagegate.pyz -> ..data/imagegate.pyz       (per-file symlink, created once)
    <target>/..data        -> ..2026_11_29_10_20_30.123  (swapped by renaming ..data_tmp over it)
    <target>/..2026_11_29_10_20_30.123/imagegate.pyz     (the real file; the old folder is removed)
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

DATA_DIR = "..data"
NEW_DATA_DIR = "..data_tmp"


class AtomicWriter:
    def __init__(self, target: Path) -> None:
        self.target = target

    def write(self, payload: dict[str, bytes], mode: int = 0o644) -> bool:
        """Project `payload` (file name -> bytes); False when nothing changed (no write)."""
        data_dir = self.target / DATA_DIR
        # (2) the current timestamped folder, read from the ..data link
        old_ts = os.readlink(data_dir) if data_dir.is_symlink() else ""
        old_ts_path = self.target / old_ts if old_ts else None
        to_remove: set[str] = set()
        if old_ts_path is not None:
            # (3) user-visible paths that the new payload drops
            to_remove = {p.name for p in old_ts_path.iterdir()} - set(payload)
            # (4) unchanged content: no update at all
            if not to_remove and all(
                (old_ts_path / k).is_file() and (old_ts_path / k).read_bytes() == v
                for k, v in payload.items()
            ):
                return False
        # (5) a new folder named after the UTC time, with a random suffix (Go's os.MkdirTemp)
        prefix = dt.datetime.now(dt.timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S.")
        ts_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=self.target))
        os.chmod(ts_dir, 0o755)
        # (6) the payload into it
        for name, content in payload.items():
            path = ts_dir / name
            path.write_bytes(content)
            os.chmod(path, mode)
        # (7) user-visible symlinks into ..data, for paths that do not have one yet
        for name in payload:
            visible = self.target / name
            if not visible.is_symlink():
                os.symlink(os.path.join(DATA_DIR, name), visible)
        # (8) ..data_tmp -> the new folder (relative), (9) renamed over ..data: the atomic swap
        new_data = self.target / NEW_DATA_DIR
        os.symlink(ts_dir.name, new_data)
        os.rename(new_data, data_dir)
        # (10) user-visible paths no longer in the payload
        for name in to_remove:
            (self.target / name).unlink()
        # (11) the previous timestamped folder is removed
        if old_ts_path is not None:
            shutil.rmtree(old_ts_path)
        return True
