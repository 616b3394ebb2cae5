"""Apply one layer's tar stream to a root folder, as the OCI image spec's layer rules say
(and as Docker and umoci do): whiteouts `.wh.NAME` remove NAME from the layers below, an
opaque marker `.wh..wh..opq` empties its folder of what the layers below put there, an entry
replaces whatever was at its path unless both are folders, hard links may point at files of
lower layers. Every write goes through `tree.RootDir`: nothing lands outside the root."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from imagegate.rootfs.tree import PathRefused, RootDir, lstat_at, remove_at, split_member_name

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
COPY_CHUNK = 1 << 20
MAX_HEADER = 8 << 20  # a PAX header or GNU long name record; real ones are a few KiB
_XATTR = "SCHILY.xattr."


class EntryRefused(Exception):
    """A layer entry that cannot be applied safely: `entry` names it, the message says why."""

    def __init__(self, entry: str, why: str):
        super().__init__(why)
        self.entry, self.why = entry, why


class EntryTooLarge(EntryRefused):
    """An entry past the bound on uncompressed bytes (a decompression bomb)."""


@dataclass
class Skipped:
    """What was not applied as the layer says: counted, said in the Root (and the evidence).
    Device nodes, set-id bits and file capabilities are never applied: the sandbox runs without
    privileges and with its own /dev, so they serve no probe, and in the cache they would be the
    host's devices and set-id programs (the cache folder is the runner's alone as well)."""

    ownership: int = 0  # entries not owned by uid/gid 0 left owned by the runner
    devices: int = 0  # character/block devices not created
    setid: int = 0  # set-uid/set-gid bits dropped from files
    capabilities: int = 0  # security.capability attributes not set
    xattrs: int = 0  # other extended attributes not set
    examples: dict[str, str] = field(default_factory=dict)

    def notes(self) -> tuple[str, ...]:
        out = []
        if self.ownership:
            out.append(
                f"ownership: {self.ownership} entries keep the runner's uid/gid (not root, or ids not mapped)"
            )
        if self.devices:
            out.append(
                f"device nodes: {self.devices} not created (the sandbox's /dev is its own; in the cache "
                f"one would be a host device), e.g. {self.examples['device']}"
            )
        if self.setid:
            out.append(
                f"set-id bits: dropped from {self.setid} files (no privilege is gained in the sandbox; "
                f"in the cache they would be set-id programs of the host), e.g. {self.examples['setid']}"
            )
        if self.capabilities:
            out.append(
                f"file capabilities: {self.capabilities} security.capability attributes not set, "
                f"e.g. {self.examples['capability']}"
            )
        if self.xattrs:
            out.append(f"extended attributes: {self.xattrs} not set, e.g. {self.examples['xattr']}")
        return tuple(out)

    def count(self, what: str, example: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        key = {"devices": "device", "capabilities": "capability"}.get(what, what)
        self.examples.setdefault(key, example)


class LayerApplier:
    """Applies layers in order to one root. `budget(n)` is asked before an entry's n bytes are
    written and raises when the bound would be passed."""

    def __init__(self, root: RootDir, *, privileged: bool | None = None):
        self.root = root
        self.privileged = os.geteuid() == 0 if privileged is None else privileged
        self.skipped = Skipped()
        # Unprivileged, folders stay u+rwx while later layers write into them; their own modes
        # are set at the end (finish()).
        self._dir_modes: dict[str, int] = {}
        self.bytes_written = 0

    def apply(self, stream: object, budget: Callable[[str, int], None]) -> int:
        """Read one layer's tar from `stream` (has .read(n)) to its end; the entry count."""
        upper: set[str] = set()  # paths this layer wrote: an opaque marker keeps them
        dirs: list[tuple[list[str], int]] = []  # (path, mtime): set once the layer is written
        count = 0
        name = "(tar header)"
        try:
            src = ForwardReader(stream)
            # "r:" over a forward-only reader: tarfile's own stream mode ("r|") copies its whole
            # buffer on every header read (measured: a fifth of the time on small files).
            with tarfile.open(fileobj=src, mode="r:") as tf:  # type: ignore[call-overload]
                while True:
                    ti = tf.next()
                    if ti is None:
                        break
                    tf.members.clear()  # stream mode would keep every header: bounded memory
                    name = ti.name
                    count += 1
                    self._entry(src, ti, upper, dirs, budget)
        except EntryRefused:
            raise
        except PathRefused as e:
            raise EntryRefused(name, str(e)) from e
        except (tarfile.TarError, EOFError) as e:  # EOFError: tarfile's stream mode, cut short
            raise EntryRefused(name, f"not a valid tar stream after this entry: {e}") from e
        except OSError as e:
            raise EntryRefused(name, f"cannot write it: {e.strerror or e}") from e
        for parts, mtime in reversed(dirs):
            self._dir_times(parts, mtime)
        self.root.forget()
        return count

    def finish(self) -> None:
        """Set the modes of folders kept writable while unpacking (unprivileged runs), deepest first."""
        for path in sorted(self._dir_modes, key=lambda p: -p.count("/")):
            parts = path.split("/")
            try:
                pfd = self.root.parent(parts, create=False)
                st = lstat_at(pfd, parts[-1])
                if st is not None and stat.S_ISDIR(st.st_mode):
                    os.chmod(parts[-1], self._dir_modes[path], dir_fd=pfd)
            except (PathRefused, OSError):
                continue  # replaced or removed by a later layer
        self.root.forget()

    def _entry(
        self,
        src: ForwardReader,
        ti: tarfile.TarInfo,
        upper: set[str],
        dirs: list[tuple[list[str], int]],
        budget: Callable[[str, int], None],
    ) -> None:
        parts = split_member_name(ti.name)
        if not parts:
            return  # the root itself ("./"): its mode stays the cache's
        base = parts[-1]
        if base.startswith(WHITEOUT):
            self._whiteout(parts, upper)
            return
        path = "/".join(parts)
        pfd = self.root.parent(parts, create=True)
        mode = stat.S_IMODE(ti.mode)
        if not (ti.isdir() or ti.isreg()) and lstat_at(pfd, base) is not None:
            self._replace(pfd, base, path)
        # Folders and files are created first and looked at only when something is in the way
        # (one syscall less per entry: most entries are new).
        if ti.isdir():
            self._dir(ti, pfd, base, mode, path)
            dirs.append((parts, int(ti.mtime)))
        elif ti.isreg():
            if ti.issparse():
                raise PathRefused("a sparse file (GNU sparse entries are not supported in layers)")
            budget(ti.name, ti.size)
            self._file(src, ti, pfd, base, mode, path)
        elif ti.issym():
            os.symlink(ti.linkname, base, dir_fd=pfd)
            self._owner(pfd, base, ti)
            self._time(pfd, base, ti)
        elif ti.islnk():
            self._hardlink(ti, pfd, base)
        elif ti.ischr() or ti.isblk():
            # Never created (Skipped says why); what was at its path is gone, as the layer says.
            self.skipped.count("devices", "/" + path)
            return
        elif ti.isfifo():
            os.mkfifo(base, 0o600, dir_fd=pfd)
            self._owner(pfd, base, ti)
            os.chmod(base, self._no_setid(mode, path), dir_fd=pfd)
            self._time(pfd, base, ti)
        else:
            raise PathRefused(f"unsupported tar entry type {ti.type!r}")
        self._mark(path, upper)

    def _dir(self, ti: tarfile.TarInfo, pfd: int, base: str, mode: int, path: str) -> None:
        """A folder entry: made, or the folder already there kept (anything else there goes)."""
        try:
            os.mkdir(base, 0o700, dir_fd=pfd)
        except FileExistsError:
            st = lstat_at(pfd, base)
            if st is None or not stat.S_ISDIR(st.st_mode):  # a folder stays; anything else goes
                self._replace(pfd, base, path)
                os.mkdir(base, 0o700, dir_fd=pfd)
        self._owner(pfd, base, ti)
        if self.privileged or mode & 0o700 == 0o700:
            self._dir_modes.pop(path, None)
            os.chmod(base, mode, dir_fd=pfd)
        else:
            self._dir_modes[path] = mode
            os.chmod(base, mode | 0o700, dir_fd=pfd)

    @staticmethod
    def _mark(path: str, upper: set[str]) -> None:
        """`path` and its folders are this layer's: opaque markers and whiteouts keep them."""
        while path and path not in upper:
            upper.add(path)
            path = path.rpartition("/")[0]

    def _whiteout(self, parts: list[str], upper: set[str]) -> None:
        base = parts[-1]
        try:
            pfd = self.root.parent(parts, create=False)
        except PathRefused as e:
            if "does not exist" in str(e):
                return  # nothing below to hide
            raise
        if base == OPAQUE:
            prefix = "/".join(parts[:-1])
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
            try:
                self._opaque(fd, prefix, upper)
            finally:
                os.close(fd)
        elif base.startswith(WHITEOUT + WHITEOUT):
            return  # other AUFS metadata (.wh..wh..plnk): not content
        else:
            name = base[len(WHITEOUT) :]
            if name in ("", ".", ".."):
                raise PathRefused(f"a whiteout of {name!r} (hides no file; would reach outside its folder)")
            path = "/".join([*parts[:-1], name])
            st = lstat_at(pfd, name)
            if path not in upper:
                remove_at(pfd, name)
                self.root.invalidate()
            elif st is not None and stat.S_ISDIR(st.st_mode):
                # Whiteouts hide only lower layers (image spec): keep what this layer wrote under it.
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
                try:
                    self._opaque(fd, path, upper)
                finally:
                    os.close(fd)

    def _opaque(self, fd: int, prefix: str, upper: set[str]) -> None:
        """Remove what lower layers put under a folder; keep what this layer wrote."""
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for name, is_dir in entries:
            path = f"{prefix}/{name}" if prefix else name
            if path not in upper:
                remove_at(fd, name)
                self.root.invalidate()
            elif is_dir:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    self._opaque(sub, path, upper)
                finally:
                    os.close(sub)

    def _replace(self, pfd: int, base: str, path: str) -> None:
        remove_at(pfd, base)
        self.root.invalidate()  # it may have been a kept folder, or a symlink on a kept path
        self._dir_modes.pop(path, None)

    def _file(
        self, src: ForwardReader, ti: tarfile.TarInfo, pfd: int, base: str, mode: int, path: str
    ) -> None:
        src.seek(ti.offset_data)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(base, flags, 0o600, dir_fd=pfd)
        except FileExistsError:
            self._replace(pfd, base, path)
            fd = os.open(base, flags, 0o600, dir_fd=pfd)
        try:
            left = ti.size
            while left > 0:
                chunk = src.read_some(min(COPY_CHUNK, left))
                if not chunk:
                    raise tarfile.ReadError("the stream ends inside this file (truncated)")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(chunk)
            self.bytes_written += ti.size
            if self.privileged:
                try:
                    os.fchown(fd, ti.uid, ti.gid)
                except OSError as e:
                    self._unowned(e, ti)
                self._xattrs(fd, ti)
            else:
                self._note_owner(ti)
            os.fchmod(fd, self._no_setid(mode, path))
            os.utime(fd, ns=(int(ti.mtime * 1e9),) * 2)
        finally:
            os.close(fd)

    def _no_setid(self, mode: int, path: str) -> int:
        if mode & (stat.S_ISUID | stat.S_ISGID):
            self.skipped.count("setid", "/" + path)
        return mode & ~(stat.S_ISUID | stat.S_ISGID)

    def _hardlink(self, ti: tarfile.TarInfo, pfd: int, base: str) -> None:
        try:
            target = split_member_name(ti.linkname)
        except PathRefused as e:
            raise PathRefused(f"hard link to {ti.linkname!r}: {e} (outside the root)") from e
        if not target:
            raise PathRefused("hard link to the root folder")
        tfd = self.root.open_folder(target[:-1])
        try:
            st = lstat_at(tfd, target[-1])
            if st is None:
                raise PathRefused(f"hard link to {ti.linkname!r}, which does not exist")
            if stat.S_ISDIR(st.st_mode):
                raise PathRefused(f"hard link to {ti.linkname!r}, a folder")
            os.link(target[-1], base, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(tfd)

    def _owner(self, pfd: int, base: str, ti: tarfile.TarInfo) -> None:
        if self.privileged:
            try:
                os.chown(base, ti.uid, ti.gid, dir_fd=pfd, follow_symlinks=False)
            except OSError as e:
                self._unowned(e, ti)
        else:
            self._note_owner(ti)

    def _unowned(self, e: OSError, ti: tarfile.TarInfo) -> None:
        # EPERM/EINVAL: root in a user namespace where this uid/gid is not mapped.
        if e.errno not in (errno.EPERM, errno.EINVAL):
            raise e
        self.skipped.ownership += 1

    def _note_owner(self, ti: tarfile.TarInfo) -> None:
        if ti.uid != os.geteuid() or ti.gid != os.getegid():
            self.skipped.ownership += 1

    def _xattrs(self, fd: int, ti: tarfile.TarInfo) -> None:
        for key, value in ti.pax_headers.items():
            if key.startswith(_XATTR):
                name = key[len(_XATTR) :]
                if name == "security.capability":
                    self.skipped.count("capabilities", f"/{ti.name.lstrip('./')}")
                    continue
                try:
                    os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))
                except OSError:
                    self.skipped.count("xattrs", f"{name} on /{ti.name.lstrip('./')}")

    def _time(self, pfd: int, base: str, ti: tarfile.TarInfo) -> None:
        os.utime(base, ns=(int(ti.mtime * 1e9),) * 2, dir_fd=pfd, follow_symlinks=False)

    def _dir_times(self, parts: list[str], mtime: int) -> None:
        try:
            pfd = self.root.parent(parts, create=False)
            st = lstat_at(pfd, parts[-1])
            if st is not None and stat.S_ISDIR(st.st_mode):
                os.utime(parts[-1], ns=(mtime * 1_000_000_000,) * 2, dir_fd=pfd, follow_symlinks=False)
        except PathRefused:
            return  # removed by a later entry of the same layer


class ForwardReader:
    """A tar stream read front to back, with the `tell()` and forward `seek()` tarfile's
    random-access mode asks for. `read_some` hands out the pieces as they come (no copy)."""

    def __init__(self, src: object):
        self._read = src.read  # type: ignore[attr-defined]
        self._buf, self._pos, self._offset = b"", 0, 0  # offset: stream position of _buf[0]

    def tell(self) -> int:
        return self._offset + self._pos

    def _fill(self) -> bool:
        self._offset += len(self._buf)
        self._buf, self._pos = self._read(COPY_CHUNK), 0
        return bool(self._buf)

    def read_some(self, n: int) -> bytes:
        if self._pos >= len(self._buf) and not self._fill():
            return b""
        whole = self._pos == 0 and n >= len(self._buf)  # the piece as it came: no copy
        out = self._buf if whole else self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def read(self, n: int = -1) -> bytes:
        # tarfile reads a header, a PAX record or a GNU long name whole: bound it (memory).
        if n < 0 or n > MAX_HEADER:
            raise tarfile.ReadError(f"a tar header record of {n} bytes (more than {MAX_HEADER}); refused")
        first = self.read_some(n)
        if len(first) == n or not first:
            return first
        parts = [first]
        got = len(first)
        while got < n:
            more = self.read_some(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or pos < self.tell():
            raise tarfile.ReadError("the layer stream can only be read forward")
        while pos > self.tell():
            if self._pos >= len(self._buf) and not self._fill():
                break
            self._pos = min(len(self._buf), self._pos + pos - self.tell())
        return self.tell()
