"""Unpacked roots kept between runs, keyed by the image's chainID.

    FOLDER/roots/<chainID hex>/rootfs/     the root (read-only use)
                              /root.json   what materialize() returns for it, and its size
                              /lock        shared-locked by every run using the root
    FOLDER/work/                          roots being unpacked, spooled archives, evicted roots
    FOLDER/locks/<chainID hex>.lock       held while one run unpacks that image

A root appears in `roots/` only complete (unpacked in `work/`, then renamed into place) and
leaves it by a rename before it is deleted, so a reader never sees half a root. Two runs
unpacking the same image: the second waits for the first and reuses its root. Eviction, when
the cache is over its bound, removes the least recently used roots first and never one that a
run holds."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from imagegate.errors import ImagegateError, UsageError
from imagegate.oci.digest import check_digest, is_digest
from imagegate.oci.verify import ConfigResult, LayerResult, LayerStatus, VerifyReport
from imagegate.rootfs.model import Root
from imagegate.rootfs.tree import remove_tree

# Bump when the layout of a root or of root.json changes: older entries are then unpacked again.
FORMAT = 1
DEFAULT_MAX_BYTES = 100 << 30
BUSY = ".busy"


def default_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "imagegate", "roots")


@dataclass(frozen=True)
class Build:
    """A root being unpacked: `rootfs` inside the work folder `path`."""

    chain_id: str
    path: str
    rootfs: str


@dataclass(frozen=True)
class CacheEntry:
    chain_id: str
    path: str  # the root folder
    size: int
    last_used: float  # seconds since the epoch
    in_use: bool  # a run holds it now
    config_digest: str
    unpacked_from: str


def _hex(chain_id: str) -> str:
    if not is_digest(chain_id):
        raise UsageError(f"{chain_id!r} is not a chainID", hint="write it as sha256: and 64 hex digits")
    return chain_id.partition(":")[2]


def _lock(path: str, flags: int, *, create: bool = True) -> int | None:
    """An fd holding a flock on `path` (created unless not `create`), or None when LOCK_NB and
    it is taken."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class RootCache:
    """A bounded folder of roots. Use as a context manager (or call close()): roots returned by
    materialize() are held, so that no other run evicts them, until release() or close()."""

    def __init__(self, folder: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.folder = os.path.abspath(folder or default_folder())
        self.max_bytes = max_bytes
        self._held: dict[str, int] = {}
        try:
            for sub in ("roots", "work", "locks"):
                os.makedirs(os.path.join(self.folder, sub), mode=0o700, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"root cache {self.folder}: cannot create it: {e.strerror}",
                hint="choose a writable folder with --cache-dir (or IMAGEGATE_CACHE)",
            ) from e

    def __enter__(self) -> RootCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()

    def release(self, root: Root) -> None:
        fd = self._held.pop(root.chain_id, None)
        if fd is not None:
            os.close(fd)

    def _entry_dir(self, chain_id: str) -> str:
        return os.path.join(self.folder, "roots", _hex(chain_id))

    # -- reading ------------------------------------------------------------------------------

    def get(self, chain_id: str) -> Root | None:
        """The cached root for `chain_id`, held and marked used; None when absent."""
        entry = self._entry_dir(chain_id)
        lock_path = os.path.join(entry, "lock")
        if chain_id in self._held:
            return self._load(entry)
        try:
            fd = _lock(lock_path, fcntl.LOCK_SH)
        except (FileNotFoundError, NotADirectoryError):
            return None
        assert fd is not None
        try:
            # Evicted between open and lock: the lock file moved away with its root.
            if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:
                raise FileNotFoundError(lock_path)
            root = self._load(entry)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            os.close(fd)
            return None
        os.utime(lock_path)  # last used
        self._held[chain_id] = fd
        return root

    def _load(self, entry: str) -> Root:
        with open(os.path.join(entry, "root.json"), encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError("an older cache format")
        return root_from_json(doc["root"], path=os.path.join(entry, "rootfs"))

    def entries(self) -> list[CacheEntry]:
        """The cached roots, least recently used first."""
        out = []
        roots = os.path.join(self.folder, "roots")
        for name in sorted(os.listdir(roots)):
            entry = os.path.join(roots, name)
            try:
                root = self._load(entry)
                used = os.stat(os.path.join(entry, "lock")).st_mtime
            except (OSError, ValueError, KeyError, TypeError):
                continue
            probe = _lock(os.path.join(entry, "lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if probe is not None:
                os.close(probe)
            held = root.chain_id in self._held or probe is None
            out.append(
                CacheEntry(
                    root.chain_id, root.path, root.size, used, held, root.config_digest, root.unpacked_from
                )
            )
        return sorted(out, key=lambda e: e.last_used)

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    # -- writing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def building(self, chain_id: str) -> Iterator[Build]:
        """Exclusive right to unpack `chain_id` (a second run waits here), and a fresh work
        folder that is removed unless commit() moved it into place."""
        lock = _lock(os.path.join(self.folder, "locks", _hex(chain_id) + ".lock"), fcntl.LOCK_EX)
        assert lock is not None
        try:
            with self.working(_hex(chain_id)) as work:
                yield Build(chain_id, work, os.path.join(work, "rootfs"))
        finally:
            os.close(lock)

    @contextlib.contextmanager
    def working(self, label: str) -> Iterator[str]:
        """A fresh folder in work/, marked busy (a flock on its `.busy` file, which prune()
        respects, whatever the pid namespace) and removed at the end unless moved away."""
        path = os.path.join(self.folder, "work", f"{label}.{os.getpid()}.{secrets.token_hex(4)}")
        os.mkdir(path, 0o700)
        busy = _lock(os.path.join(path, BUSY), fcntl.LOCK_EX)
        assert busy is not None
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                remove_tree(path)  # gone already once committed
            os.close(busy)

    def commit(self, build: Build, root: Root) -> Root:
        """Move a complete root into place, hold it, and evict others past the bound."""
        entry = self._entry_dir(build.chain_id)
        with open(os.path.join(build.path, "root.json"), "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "root": root_to_json(root)}, f, indent=1)
        open(os.path.join(build.path, "lock"), "w").close()
        os.unlink(os.path.join(build.path, BUSY))  # the build lock still keeps other builders out
        if os.path.isdir(entry) and not self._discard(entry):  # an older format, get() refused it
            raise UsageError(
                f"root cache {self.folder}: an older entry for {build.chain_id} is in use; not replaced",
                hint="run again when the other check has finished, or use another --cache-dir",
            )
        os.rename(build.path, entry)
        held = self.get(build.chain_id)
        assert held is not None
        self.prune(self.max_bytes)
        return held

    def _discard(self, entry: str) -> bool:
        """Remove a root unless a run holds it."""
        fd = _lock(os.path.join(entry, "lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        try:
            trash = os.path.join(self.folder, "work", f"evicted.{os.getpid()}.{secrets.token_hex(4)}")
            os.rename(entry, trash)
        finally:
            os.close(fd)
        remove_tree(trash)
        return True

    def prune(self, max_bytes: int | None = None) -> list[CacheEntry]:
        """Evict least recently used roots until the cache holds at most `max_bytes` (0: all
        that no run holds); also clears work folders left by runs that died. The roots removed."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        self._clear_work()
        entries = self.entries()
        total = sum(e.size for e in entries)
        removed = []
        for e in entries:
            if total <= limit:
                break
            if not e.in_use and self._discard(self._entry_dir(e.chain_id)):
                total -= e.size
                removed.append(e)
        return removed

    def remove(self, chain_id: str) -> bool:
        """Remove one root; False when absent. Raises UsageError when a run holds it."""
        entry = self._entry_dir(chain_id)
        if not os.path.isdir(entry):
            return False
        if chain_id in self._held or not self._discard(entry):
            raise UsageError(
                f"root {chain_id} is in use by a running check; not removed",
                hint="try again when the run has finished",
            )
        return True

    def remove_each(self, chain_ids: Iterable[str]) -> tuple[list[str], list[ImagegateError]]:
        """Remove roots by chainID: (removed, problems). A malformed, absent or held chainID is
        a problem of its own; the others are still removed."""
        removed: list[str] = []
        problems: list[ImagegateError] = []
        for c in chain_ids:
            try:
                if self.remove(check_digest(c, what="chainID")):
                    removed.append(c)
                else:
                    problems.append(
                        UsageError(
                            f"no root {c} in the cache {self.folder}",
                            hint="`imagegate cache list` shows the chainIDs",
                        )
                    )
            except ImagegateError as e:
                problems.append(e)
        return removed, problems

    def _clear_work(self) -> None:
        """Remove work folders whose run is gone (no process holds their build lock)."""
        work = os.path.join(self.folder, "work")
        for name in os.listdir(work):
            path = os.path.join(work, name)
            try:
                busy = _lock(os.path.join(path, BUSY), fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
            except FileNotFoundError:  # an evicted root being deleted, or a folder just made
                parts = name.split(".")
                if len(parts) == 3 and parts[1].isdigit() and _alive(int(parts[1])):
                    continue
            except OSError:
                continue
            else:
                if busy is None:
                    continue  # a run is using it
                os.close(busy)
            with contextlib.suppress(OSError):
                remove_tree(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- root.json ------------------------------------------------------------------------------------


def root_to_json(root: Root) -> dict[str, Any]:
    d = {f.name: getattr(root, f.name) for f in fields(root) if f.name not in ("path", "report", "cached")}
    d["report"] = root.report.to_dict()
    d["written_at"] = time.time()
    return json.loads(json.dumps(d, default=str))  # type: ignore[no-any-return]


def report_from_json(d: dict[str, Any]) -> VerifyReport:
    c = dict(d["config"])
    c.pop("matches_official", None)
    config = ConfigResult(**{**c, "status": LayerStatus(c["status"])})
    layers = tuple(
        LayerResult(**{**x, "status": LayerStatus(x["status"]), "urls": tuple(x.get("urls") or ())})
        for x in d["layers"]
    )
    keep = {f.name for f in fields(VerifyReport)} - {"config", "layers", "config_doc"}
    rest = {k: v for k, v in d.items() if k in keep}
    rest["diff_ids"], rest["problems"] = tuple(rest["diff_ids"]), tuple(rest["problems"])
    return VerifyReport(config=config, layers=layers, **rest)


def root_from_json(d: dict[str, Any], *, path: str) -> Root:
    tup = {k: tuple(d[k]) if d[k] is not None else None for k in ("env", "entrypoint", "cmd")}
    names = {f.name for f in fields(Root)} - {"path", "report", "cached"}
    base = {k: d[k] for k in names}
    base.update(tup)
    base["not_applied"] = tuple(d["not_applied"])
    return Root(path=path, report=report_from_json(d["report"]), cached=True, **base)
