"""Unpacked roots kept between runs, keyed by the image's chainID.

    FOLDER/roots/<chainID hex>/rootfs/     the root (read-only use)
                              /root.json   what materialize() returns for it, and its size
                              /lock        shared-locked by every run using the root
    FOLDER/work/                          roots being unpacked, spooled archives, evicted roots
    FOLDER/locks/<chainID hex>.lock       held while one run unpacks that image
    FOLDER/pairs/<algorithm>-<hex>        verified pairs: blob digest -> size, diffID (rootfs/pairs.py)

The folder is the runner's own (rootfs/folder.py checks it); inside it nothing is followed
through a symlink: entries, their lock, root.json and rootfs are opened relative to the folder's
fds, and an entry imagegate did not make is refused (Planted), never used.

A root appears in `roots/` only complete (unpacked in `work/`, then renamed into place) and
leaves it by a rename before it is deleted, so a reader never sees half a root. Two runs
unpacking the same image: the second waits for the first and reuses its root. Eviction, when
the cache is over its bound, removes the least recently used roots first and never one that a
run holds."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from imagegate._support.jsontypes import JsonObject
from imagegate.domain.digest import check_digest, is_digest
from imagegate.errors import ImagegateError, UsageError
from imagegate.oci.layercheck import ConfigResult, LayerResult, LayerStatus, VerifyReport
from imagegate.rootfs.folder import SUBFOLDERS, open_cache_folder, open_subfolder
from imagegate.rootfs.pairs import PairStore
from imagegate.rootfs.root import Root
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


def _lock(path: str, flags: int, *, create: bool = True, dir_fd: int | None = None) -> int | None:
    """An fd holding a flock on `path` (created unless not `create`; never through a symlink),
    or None when LOCK_NB and it is taken."""
    mode = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    fd = os.open(path, mode, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class Planted(UsageError):
    """A cache entry that imagegate did not make (a symlink, another owner): refused, never used."""


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ROOT_JSON = 16 << 20


class RootCache:
    """A bounded folder of roots. Use as a context manager (or call close()): roots returned by
    materialize() are held, so that no other run evicts them, until release() or close(). The
    folder is checked (rootfs/folder.py): the runner's own, or refused (UsageError)."""

    def __init__(self, folder: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.folder = os.path.abspath(folder or default_folder())
        self.max_bytes = max_bytes
        self.notes: list[str] = []  # what the folder check changed (a mode tightened)
        self._held: dict[str, int] = {}
        self._fd = open_cache_folder(self.folder, default=folder is None, notes=self.notes)
        self._sub = {s: open_subfolder(self._fd, self.folder, s) for s in SUBFOLDERS}
        self.pairs = PairStore(self._sub["pairs"])

    def __enter__(self) -> RootCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()
        for fd in [*self._sub.values(), self._fd] if self._sub else []:
            os.close(fd)
        self._sub = {}

    def release(self, root: Root) -> None:
        fd = self._held.pop(root.chain_id, None)
        if fd is not None:
            os.close(fd)

    def _entry_dir(self, chain_id: str) -> str:
        return os.path.join(self.folder, "roots", _hex(chain_id))

    def _planted(self, name: str, what: str, chain_id: str) -> Planted:
        return Planted(
            f"root cache {self.folder}: roots/{name}: {what}: imagegate did not make this entry; not used",
            hint=f"remove it (imagegate cache remove {chain_id} --cache-dir {self.folder}) and find out "
            "who wrote into this folder",
        )

    # -- reading ------------------------------------------------------------------------------

    def get(self, chain_id: str) -> Root | None:
        """The cached root for `chain_id`, held and marked used; None when absent (or unreadable:
        unpacked again). Raises Planted for an entry imagegate did not make."""
        name = _hex(chain_id)
        entry = self._open_entry(name, chain_id)
        if entry is None:
            return None
        try:
            if chain_id in self._held:
                return self._load(entry, name, chain_id)
            try:
                fd = _lock("lock", fcntl.LOCK_SH, dir_fd=entry)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise self._planted(name, "its lock is a symlink", chain_id) from e
                return None
            assert fd is not None
            try:
                # Evicted between open and lock: the entry moved away.
                now = os.stat(name, dir_fd=self._sub["roots"], follow_symlinks=False)
                if now.st_ino != os.fstat(entry).st_ino:
                    raise FileNotFoundError(name)
                root = self._load(entry, name, chain_id)
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            os.utime(fd)  # last used
            self._held[chain_id] = fd
            return root
        finally:
            os.close(entry)

    def _open_entry(self, name: str, chain_id: str) -> int | None:
        try:
            fd = os.open(name, _DIR, dir_fd=self._sub["roots"])
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._planted(name, "not a folder (a symlink?)", chain_id) from e
            raise
        if os.fstat(fd).st_uid != os.geteuid():
            os.close(fd)
            raise self._planted(name, "owned by another user", chain_id)
        return fd

    def _load(self, entry: int, name: str, chain_id: str | None = None) -> Root:
        """root.json of the open entry, its rootfs checked (a real folder, ours). Raises Planted
        for what imagegate did not make; ValueError/KeyError/TypeError when unreadable."""
        cid = chain_id or "sha256:" + name
        try:
            fd = os.open(
                "root.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=entry
            )
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise self._planted(name, "root.json is a symlink", cid) from e
            raise ValueError("no root.json") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise self._planted(name, "root.json is not a file of this user", cid)
            if st.st_size > MAX_ROOT_JSON:
                raise ValueError("root.json too large")
            with os.fdopen(os.dup(fd), "rb") as f:
                doc = json.loads(f.read(MAX_ROOT_JSON + 1))
        finally:
            os.close(fd)
        if doc.get("format") != FORMAT:
            raise ValueError("an older cache format")
        rst = os.stat("rootfs", dir_fd=entry, follow_symlinks=False)
        if stat.S_ISLNK(rst.st_mode):
            target = os.readlink("rootfs", dir_fd=entry)
            raise self._planted(name, f"rootfs is a symlink (to {target}), not a folder", cid)
        if not stat.S_ISDIR(rst.st_mode) or rst.st_uid != os.geteuid():
            raise self._planted(name, "rootfs is not a folder of this user", cid)
        root = root_from_json(doc["root"], path=os.path.join(self.folder, "roots", name, "rootfs"))
        if root.chain_id != cid:
            raise self._planted(name, f"root.json names another chainID ({root.chain_id})", cid)
        return root

    def entries(self) -> list[CacheEntry]:
        """The cached roots, least recently used first (entries imagegate did not make left out)."""
        out = []
        roots = self._sub["roots"]
        for name in sorted(os.listdir(roots)):
            try:
                entry = os.open(name, _DIR, dir_fd=roots)
            except OSError:
                continue
            try:
                root = self._load(entry, name)
                used = os.stat("lock", dir_fd=entry, follow_symlinks=False).st_mtime
                probe = _lock("lock", fcntl.LOCK_EX | fcntl.LOCK_NB, dir_fd=entry)
            except (OSError, ValueError, KeyError, TypeError, UsageError):
                continue
            finally:
                os.close(entry)
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
        lock = _lock(_hex(chain_id) + ".lock", fcntl.LOCK_EX, dir_fd=self._sub["locks"])
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
        name = f"{label}.{os.getpid()}.{secrets.token_hex(4)}"
        os.mkdir(name, 0o700, dir_fd=self._sub["work"])
        path = os.path.join(self.folder, "work", name)
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
        name = _hex(build.chain_id)
        data = json.dumps({"format": FORMAT, "root": root_to_json(root)}, indent=1).encode()
        new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.join(build.path, "root.json"), new, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.close(os.open(os.path.join(build.path, "lock"), new, 0o600))
        os.unlink(os.path.join(build.path, BUSY))  # the build lock still keeps other builders out
        roots = self._sub["roots"]
        if os.path.lexists(os.path.join(self.folder, "roots", name)) and not self._discard(name):
            raise UsageError(  # an older format, get() refused it
                f"root cache {self.folder}: an older entry for {build.chain_id} is in use; not replaced",
                hint="run again when the other check has finished, or use another --cache-dir",
            )
        os.rename(os.path.basename(build.path), name, src_dir_fd=self._sub["work"], dst_dir_fd=roots)
        held = self.get(build.chain_id)
        assert held is not None
        self.prune(self.max_bytes)
        return held

    def _discard(self, name: str) -> bool:
        """Remove the entry roots/`name` unless a run holds it."""
        roots = self._sub["roots"]
        try:
            entry = os.open(name, _DIR, dir_fd=roots)
        except OSError:
            entry = None  # a planted symlink or file: removed as it is, never followed
        fd = None
        try:
            if entry is not None:
                with contextlib.suppress(OSError):
                    fd = _lock("lock", fcntl.LOCK_EX | fcntl.LOCK_NB, dir_fd=entry)
                    if fd is None:
                        return False
            trash = f"evicted.{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(name, trash, src_dir_fd=roots, dst_dir_fd=self._sub["work"])
        finally:
            if fd is not None:
                os.close(fd)
            if entry is not None:
                os.close(entry)
        remove_tree(os.path.join(self.folder, "work", trash))
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
            if not e.in_use and self._discard(_hex(e.chain_id)):
                total -= e.size
                removed.append(e)
        return removed

    def remove(self, chain_id: str) -> bool:
        """Remove one root; False when absent. Raises UsageError when a run holds it."""
        name = _hex(chain_id)
        if not os.path.lexists(os.path.join(self.folder, "roots", name)):
            return False
        if chain_id in self._held or not self._discard(name):
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
        for name in os.listdir(self._sub["work"]):
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


def root_to_json(root: Root) -> JsonObject:
    d = {f.name: getattr(root, f.name) for f in fields(root) if f.name not in ("path", "report", "cached")}
    d["report"] = root.report.to_dict()
    d["written_at"] = time.time()
    return json.loads(json.dumps(d, default=str))  # type: ignore[no-any-return]


# root.json back into the frozen dataclasses it was written from, by `**` of their own fields:
# the values are taken as written (a file of this user's, root_to_json's); a field missing or
# unknown raises TypeError/KeyError, which _load's callers read as no entry.
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
