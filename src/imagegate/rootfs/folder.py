"""The root cache's folder: the runner's own, or refused.

A root in the cache is run as found and a verified pair is believed as found, so the folder must
be one no other user can write into: the folder and every parent made for it owned by the user
running imagegate, none writable by group or others, the folder itself reachable by nobody else
(mode 0700: a set-id file or a device node unpacked as root is then out of other users' reach),
no symlink in place of any of them. Existing parents above the folder that the runner did not
make are the user's choice and are not checked."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import stat

from imagegate.errors import UsageError

log = logging.getLogger(__name__)

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SUBFOLDERS = ("roots", "work", "locks", "pairs")


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _refuse(path: str, what: str, hint: str) -> UsageError:
    return UsageError(f"root cache {path}: {what}; not used", hint=hint)


def _make_missing(path: str) -> list[str]:
    """Create the missing folders down to `path` (0700), top first; the ones made here."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    made = []
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
            made.append(p)
        except FileExistsError:
            pass  # made meanwhile by someone else: checked as an existing folder
        except OSError as e:
            raise UsageError(
                f"root cache {path}: cannot create {p}: {e.strerror}",
                hint="choose a writable folder with --cache-dir (or IMAGEGATE_CACHE)",
            ) from e
    return made


def open_checked(path: str, *, private: bool, made: bool, may_tighten: bool, notes: list[str]) -> int:
    """An fd of the folder `path` once it is a real folder (no symlink) owned by this user and
    not writable by group/others (`private`: not reachable by them at all). A folder made by this
    run, or one `may_tighten` (the default cache, made by this user), is tightened instead of
    refused (said in `notes` and on the log)."""
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as e:
        if os.path.islink(path):
            target = os.readlink(path)
            raise _refuse(
                path,
                f"it is a symlink (to {target}), not a folder",
                f"give the folder itself (--cache-dir {os.path.realpath(path)}) if it is yours",
            ) from e
        raise _refuse(path, f"cannot open it as a folder: {e.strerror}", "choose another --cache-dir") from e
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if st.st_uid != me:
            raise _refuse(
                path,
                f"owned by {_user(st.st_uid)}, not by {_user(me)} who runs imagegate: that user could plant "
                "roots and verified pairs in it",
                "use a folder of your own (--cache-dir or IMAGEGATE_CACHE)",
            )
        loose = stat.S_IMODE(st.st_mode) & (0o077 if private else 0o022)
        if loose:
            mode = stat.S_IMODE(st.st_mode)
            if not (made or may_tighten):
                who = (
                    "group/others can reach it"
                    if private and not loose & 0o022
                    else "group/others can write it"
                )
                raise _refuse(
                    path,
                    f"mode {mode:04o}: {who}",
                    f"chmod {'700' if private else 'go-w'} {path} (it must be yours alone), or use another --cache-dir",
                )
            os.fchmod(fd, mode & ~loose)
            note = f"root cache folder {path}: mode {mode:04o} tightened to {mode & ~loose:04o} (made by this user)"
            if not made:
                notes.append(note)
                log.warning("%s", note)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_cache_folder(path: str, *, default: bool, notes: list[str]) -> int:
    """The checked cache folder (see the module docstring); its subfolders made and checked. For
    the default folder its `imagegate` parent is the runner's own too."""
    made = set(_make_missing(path))
    for p in sorted(made):  # top first: each a prefix of the next
        if p != path:
            os.close(open_checked(p, private=False, made=True, may_tighten=False, notes=notes))
    if default:
        parent = os.path.dirname(path)
        os.close(open_checked(parent, private=False, made=parent in made, may_tighten=True, notes=notes))
    fd = open_checked(path, private=True, made=path in made, may_tighten=default, notes=notes)
    try:
        for sub in SUBFOLDERS:
            with contextlib.suppress(FileExistsError):
                os.mkdir(sub, 0o700, dir_fd=fd)
            os.close(open_subfolder(fd, path, sub))
    except OSError as e:
        os.close(fd)
        raise UsageError(
            f"root cache {path}: cannot create {sub}/ in it: {e.strerror}",
            hint="choose a writable folder with --cache-dir (or IMAGEGATE_CACHE)",
        ) from e
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_subfolder(fd: int, path: str, sub: str) -> int:
    """An fd of `sub` in the cache folder: a real folder owned by this user, else refused."""
    try:
        sfd = os.open(sub, _OPEN_DIR, dir_fd=fd)
    except OSError as e:
        raise _refuse(
            path,
            f"{sub}/ is not a folder ({e.strerror}; a symlink?)",
            f"remove {os.path.join(path, sub)} and look at who wrote into this folder",
        ) from e
    st = os.fstat(sfd)
    if st.st_uid != os.geteuid():
        os.close(sfd)
        raise _refuse(
            path,
            f"{sub}/ is owned by {_user(st.st_uid)}, not by {_user(os.geteuid())}",
            f"remove {os.path.join(path, sub)} and look at who wrote into this folder",
        )
    return sfd
