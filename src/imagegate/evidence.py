"""The append-only run store. Every run gets a new attempt folder
`OUT/<image key>/<UTC time>-<random>/`, created exclusively; files in it are created exclusively
too, and `index.jsonl` beside the attempts is only ever appended to. No run overwrites an earlier
attempt or its conclusion."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from imagegate.errors import UsageError
from imagegate.model import EvidenceFile, ImageFacts


def image_key(image: ImageFacts) -> str:
    """Folder name per image: its config digest (`sha256-<hex>`: no colon in paths), or for an
    environment without one, a sanitised reference."""
    if image.config_digest:
        algo, _, hexd = image.config_digest.partition(":")
        return f"{algo}-{hexd}"
    return "ref-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", image.reference).strip("_") or "unnamed")[:100]


class Attempt:
    def __init__(self, out: Path, image: ImageFacts, *, now: dt.datetime | None = None) -> None:
        now = now or dt.datetime.now(dt.timezone.utc)
        self.image_dir = out / image_key(image)
        try:
            self.image_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"evidence folder {out}: cannot create it ({e.strerror})", hint="pass --out DIR"
            ) from e
        self.id = f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(3)}"
        self.dir = self.image_dir / self.id
        self.dir.mkdir(exist_ok=False)  # exclusive: a clash raises instead of mixing two runs
        self._files: dict[str, EvidenceFile] = {}

    def write(self, rel: str, data: bytes | str) -> EvidenceFile:
        if isinstance(data, str):
            data = data.encode("utf-8")
        path = self.dir / rel
        if ".." in Path(rel).parts or (path.is_absolute() and not str(path).startswith(str(self.dir))):
            raise ValueError(f"evidence path {rel!r} escapes the attempt folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
        ef = EvidenceFile(rel, hashlib.sha256(data).hexdigest(), len(data))
        self._files[rel] = ef
        return ef

    def write_json(self, rel: str, obj: Any) -> EvidenceFile:
        return self.write(rel, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def files(self) -> list[EvidenceFile]:
        return sorted(self._files.values(), key=lambda f: f.path)

    def append_index(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        fd = os.open(self.image_dir / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write with O_APPEND: concurrent runs never interleave a line
        finally:
            os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
