"""The append-only run store. Every run gets a new attempt folder
`OUT/<image key>/<UTC time>-<random>/`, created exclusively; files in it are created exclusively
too, and `index.jsonl` beside the attempts is only ever appended to. No run overwrites an earlier
attempt or its conclusion."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from imagegate.domain.digest import is_digest
from imagegate.domain.results import EvidenceFile, ImageFacts
from imagegate.errors import EngineError, UsageError


def image_key(image: ImageFacts) -> str:
    """Folder name per image: its config digest (`sha256-<hex>`: no colon in paths), or for an
    environment without one, a sanitised reference. The digest comes from an engine or a
    registry: anything but `algorithm:hex` is refused, never made a path."""
    if image.config_digest:
        if not is_digest(image.config_digest):
            raise EngineError(
                f"image ID {image.config_digest!r} is not a digest (sha256: and 64 hex characters)",
                hint="the engine or registry answered a malformed ID; check what DOCKER_HOST points at",
            )
        algo, _, hexd = image.config_digest.partition(":")
        return f"{algo}-{hexd}"
    return "ref-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", image.reference).strip("_") or "unnamed")[:100]


INDEX = "index.jsonl"
RUN_FILE = "run.json"  # the environment and each controller's facts


class Attempt:
    def __init__(
        self, out: Path, image: ImageFacts, *, now: dt.datetime | None = None, key: str | None = None
    ) -> None:
        """`key`: the folder name in place of the image's (an index statement's `index-<digest>`)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        self.image_dir = out / (key or image_key(image))
        try:
            out.mkdir(parents=True, exist_ok=True)
            _inside(out, self.image_dir)
            _real_dir(self.image_dir)
        except OSError as e:
            raise UsageError(
                f"evidence folder {out}: cannot create it ({e.strerror})", hint="pass --out DIR"
            ) from e
        # Checked (and created) before the run starts: a planted link or folder in its place
        # must stop the run, not surface after the container ran, nor be written through.
        self._open_index().close()
        self.id = f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(3)}"
        self.dir = self.image_dir / self.id
        try:
            self.dir.mkdir(exist_ok=False)  # exclusive: a clash raises instead of mixing two runs
        except FileExistsError as e:
            raise UsageError(f"attempt folder {self.dir}: something is already there", hint=_HINT) from e

    @classmethod
    def begin(cls, out: Path, image: ImageFacts, inputs: Mapping[str, bytes | str]) -> Attempt:
        """A fresh attempt folder for `image` under `out`, holding the run's inputs."""
        attempt = cls(out, image)
        for rel, data in inputs.items():
            attempt.write(rel, data)
        return attempt

    def write(self, rel: str, data: bytes | str) -> EvidenceFile:
        if isinstance(data, str):
            data = data.encode("utf-8")
        path = self._place(rel)
        # O_EXCL: never an existing file, nor a link (even a dangling one) at the last component.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return EvidenceFile(rel, hashlib.sha256(data).hexdigest(), len(data))

    def write_json(self, rel: str, obj: object) -> EvidenceFile:
        return self.write(rel, json_bytes(obj))

    def _open_index(self) -> _Index:
        path = self.image_dir / INDEX
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            # ELOOP: a symbolic link; EISDIR: a folder. Either way, not the index we keep.
            what = "a symbolic link" if path.is_symlink() else "not a file" if path.exists() else e.strerror
            raise UsageError(f"run index {path}: {what}; refusing to write through it", hint=_HINT) from e
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"run index {path}: not a regular file; refusing to write to it", hint=_HINT)
        return _Index(fd)

    def _place(self, rel: str) -> Path:
        """Where `rel` goes in this attempt, its folders made (each a real one): never outside."""
        parts = Path(rel).parts
        if not parts or ".." in parts or Path(rel).is_absolute():
            raise ValueError(f"evidence path {rel!r} escapes the attempt folder")
        parent = self.dir
        for part in parts[:-1]:
            parent = parent / part
            _real_dir(parent)
        return self.dir / rel

    def take(self, rel: str, src: Path) -> EvidenceFile:
        """The file `src` (a regular file, never through a symlink) at `rel` in this attempt: hard
        linked where it can be (the same bytes at no cost), else copied; hashed as it now is here."""
        path = self._place(rel)
        try:
            os.link(src, path, follow_symlinks=False)  # the entry itself: a symlink stays one, refused below
        except OSError:  # another file system: a copy, read never through a symlink, written exclusively
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(out, "wb") as f, os.fdopen(fd, "rb") as r:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
        if not stat.S_ISREG(os.lstat(path).st_mode):
            path.unlink()
            raise UsageError(f"{src}: not a regular file; not taken as evidence")
        return EvidenceFile(rel, sha256_file(path), path.stat().st_size)

    def write_conclusion(
        self, run_json: bytes, statement: Mapping[str, object], index_entry: dict[str, object]
    ) -> None:
        """What a run concluded, in one step: run.json (the bytes the statement lists), then
        statement.json (the payload that is signed), then the attempt's line in the index, last,
        so the index never names an attempt whose statement is not written."""
        self.write(RUN_FILE, run_json)
        self.write_json("statement.json", statement)
        self.append_index(index_entry)

    def append_index(self, entry: dict[str, object]) -> None:
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with self._open_index() as index:
            os.write(index.fd, line)  # one write with O_APPEND: concurrent runs never interleave a line


_HINT = "something other than imagegate put it there: look at it, move it away, or pass another --out DIR"


class _Index:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _inside(out: Path, path: Path) -> None:
    """`path` (not yet made) is a child of `out`: the image key never leads elsewhere."""
    if path.parent.resolve() != out.resolve() or path.name in ("", ".", ".."):
        raise EngineError(f"evidence folder {path}: outside {out}; refusing to write there")


def _real_dir(path: Path) -> None:
    """Create `path` if needed; it must be a directory of its own, never a link to one elsewhere."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    if path.is_symlink():
        raise UsageError(f"evidence folder {path}: a symbolic link; refusing to write through it", hint=_HINT)
    if not path.is_dir():
        raise UsageError(f"evidence folder {path}: not a folder", hint=_HINT)


def json_bytes(obj: object) -> bytes:
    """A JSON evidence file's bytes, as every writer of the attempt folder lays them out."""
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
