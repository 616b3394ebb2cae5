"""File operations confined to one root folder, whatever the folder holds.

Every path is walked one component at a time with `openat`-style calls (`dir_fd`,
`O_NOFOLLOW`): a symlink met on the way is resolved inside the root (an absolute target
starts again at the root, `..` stops at the root), as a chroot would resolve it, so no
symlink planted by a layer can make a later write land outside the root. The last component
of a path is never followed."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

# As the kernel's limit on symlinks in one lookup (MAXSYMLINKS).
MAX_SYMLINK_HOPS = 40
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class PathRefused(Exception):
    """A path that cannot be written inside the root (the message says why)."""


def split_member_name(name: str) -> list[str]:
    """The components of a layer entry's name; refuses absolute names and `..` (a layer written
    by a builder never has either)."""
    if "\0" in name:
        raise PathRefused("the name holds a NUL byte")
    if name.startswith("/"):
        raise PathRefused("absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("'..' in the path (path traversal)")
    return parts


class RootDir:
    """An open root folder and scoped lookups inside it. Folders looked up are kept open by
    name (a layer's entries come folder by folder), up to CACHE_FDS of them; the caller calls
    invalidate() after removing anything, since a removed folder or symlink may be on a kept
    path. Kept fds are closed only at the next lookup: one handed out stays valid until then."""

    CACHE_FDS = 256

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, _DIR_FLAGS)
        self._dirs: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {}  # name path -> (fd, resolved)
        self._stale: list[int] = []

    def close(self) -> None:
        self.invalidate()
        self._close_stale()
        os.close(self.fd)

    def invalidate(self) -> None:
        self._stale.extend(fd for fd, _ in self._dirs.values())
        self._dirs.clear()

    def forget(self) -> None:
        self.invalidate()

    def _close_stale(self) -> None:
        for fd in self._stale:
            os.close(fd)
        self._stale.clear()

    def parent(self, parts: list[str], *, create: bool) -> int:
        """An fd (O_PATH) of the folder holding `parts[-1]`, creating missing folders (0755) when
        `create`. The fd belongs to this object: do not close it."""
        return self.folder(parts[:-1], create=create)

    def folder(self, parts: list[str] | tuple[str, ...], *, create: bool) -> int:
        key = tuple(parts)
        hit = self._dirs.get(key)
        if hit is not None:
            return hit[0]
        self._close_stale()
        if len(self._dirs) >= self.CACHE_FDS:
            self.invalidate()
            self._close_stale()
        k = len(key) - 1
        while k > 0 and key[:k] not in self._dirs:
            k -= 1
        start = self._dirs.get(key[:k]) if k > 0 else None
        fd, resolved = (start[0], list(start[1])) if start else (self.fd, [])
        return self._walk(key, k, os.dup(fd), resolved, create=create)

    def _walk(self, key: tuple[str, ...], k: int, fd: int, resolved: list[str], *, create: bool) -> int:
        """Resolve key[k:] from `fd` (the folder `resolved`), caching each folder reached by
        plain names (no symlink on the way: then a name path is a resolved path)."""
        stack = list(reversed(key[k:]))
        consumed = k  # components of `key` consumed without a symlink hop
        hops = 0
        try:
            while stack:
                name = stack.pop()
                if name in ("", "."):
                    continue
                if name == "..":  # only from a symlink's target: stops at the root
                    if resolved:
                        resolved.pop()
                    os.close(fd)
                    fd = os.dup(self.fd)
                    for p in resolved:
                        nfd = os.open(p, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                        os.close(fd)
                        fd = nfd
                    continue
                child = self._open_child(fd, name, resolved, create=create)
                if child is None:  # a symlink: its target's components come next
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise PathRefused(
                            "too many levels of symbolic links (a symlink loop, or one that points outside the root)"
                        ) from None
                    target = os.readlink(name, dir_fd=fd)
                    if target.startswith("/"):
                        resolved = []
                        os.close(fd)
                        fd = os.dup(self.fd)
                    stack.extend(reversed([p for p in target.split("/") if p]))
                    continue
                os.close(fd)
                fd = child
                resolved.append(name)
                if hops == 0:
                    consumed += 1
                    self._dirs[key[:consumed]] = (os.dup(fd), tuple(resolved))
            if hops == 0:
                os.close(fd)
                return self._dirs[key][0] if key else self.fd
            self._dirs[key] = (fd, tuple(resolved))
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _open_child(fd: int, name: str, resolved: list[str], *, create: bool) -> int | None:
        """A new fd of the folder `name` in `fd` (the folder `resolved`), made (0755) when missing
        and `create`; None when `name` is a symlink (the caller resolves it inside the root)."""
        try:
            return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise PathRefused(f"{'/'.join([*resolved, name])} does not exist") from None
            os.mkdir(name, 0o755, dir_fd=fd)
            os.chmod(name, 0o755, dir_fd=fd)  # as Docker makes missing parents, whatever the umask
            return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except (NotADirectoryError, OSError) as e:
            if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                raise PathRefused(f"{'/'.join([*resolved, name])} is not a directory") from None
            return None

    def open_folder(self, parts: list[str]) -> int:
        """A new fd (the caller closes it) of an existing folder."""
        return os.dup(self.folder(parts, create=False))


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_at(dir_fd: int, name: str) -> None:
    """Remove `name` (a file, link or whole folder) without following any symlink."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    if st.st_mode & 0o700 != 0o700:
        # An unprivileged runner cannot list or empty a folder it may not write (mode 0555).
        os.chmod(name, 0o700 | stat.S_IMODE(st.st_mode), dir_fd=dir_fd)  # a folder: lstat said so
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        empty_dir(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def empty_dir(fd: int, keep: frozenset[str] = frozenset()) -> None:
    with os.scandir(fd) as it:
        names = [e.name for e in it if e.name not in keep]
    for n in names:
        remove_at(fd, n)


def remove_tree(path: str) -> None:
    """Remove a folder tree (a root, a partial root) that may hold read-only folders."""
    parent, name = os.path.split(os.path.abspath(path))
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            remove_at(fd, name)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
    finally:
        os.close(fd)
