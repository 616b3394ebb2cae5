"""The image list of `imagegate audit`, an inventory file (apiVersion imagegate/v1, kind Inventory): images to
run a pipeline against, and (official, mirror) pairs to compare. Strict: unknown keys are errors
that name the file, the line and the key. Relative paths in it are relative to the file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from imagegate._support.files import read_named
from imagegate.errors import UsageError
from imagegate.oci.reference import check_image
from imagegate.pipeline.load import (  # the pipeline file's reader and error words, shared
    key_text,
    line_of,
    message,
    read_yaml,
)
from imagegate.pipeline.spec import parse_duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Defaults(_Strict):
    pipeline: str = "python"
    require_complete: bool = False
    platform: str | None = Field(
        default=None, description="os/arch[/variant] for mirror pairs read from an index."
    )


class ImageEntry(_Strict):
    image: str = Field(min_length=1, description="Reference or ID in the engine (DOCKER_HOST is honoured).")
    name: str | None = None
    pipeline: str | None = None
    modules: list[str] = Field(default_factory=list)
    require_complete: bool | None = None
    timeout: float | None = None

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        try:  # as `run IMAGE`: refused before the engine is asked (a path would reach its API)
            return check_image(v, "image")
        except UsageError as e:
            raise ValueError(str(e)) from None


class MirrorEntry(_Strict):
    official: str = Field(
        min_length=1, description="docker://REF, docker-daemon:REF, docker-archive:PATH, oci:DIR[:TAG]."
    )
    mirror: str = Field(min_length=1)
    name: str | None = None
    deep: bool = False
    platform: str | None = None
    insecure: bool = False


class MirrorSet(_Strict):
    """Many (official, mirror) pairs at once: every tag of a mirrored repository, or of every
    repository under a namespace, each compared with the official image its pattern names."""

    mirror: str = Field(
        min_length=1,
        description="REGISTRY/REPOSITORY (its tags), or REGISTRY/NAMESPACE/* (every repository the "
        "registry's catalog lists under it, and their tags).",
    )
    official: str = Field(
        min_length=1,
        description="The official image of each: a reference with {repository} (the path below the "
        "namespace, or the repository's name) and {tag}, e.g. docker.io/vllm/{repository}:{tag}.",
    )
    tags: list[str] | None = Field(
        default=None,
        description="Tags, or shell patterns of tags (v0.*); default every tag the registry lists. "
        "Plain names need no listing (a registry with listing disabled).",
    )
    name: str | None = None
    deep: bool = False
    platform: str | None = None
    insecure: bool = False

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, v: str) -> str:
        body = v.removeprefix("docker://")
        if "/" not in body or ":" in body.split("/", 1)[1] or "@" in body:
            raise ValueError("REGISTRY/REPOSITORY or REGISTRY/NAMESPACE/*, with no tag or digest")
        if ("*" in body and not body.endswith("/*")) or body.count("*") > 1:
            raise ValueError("a namespace is written REGISTRY/NAMESPACE/* (one * at the end)")
        return body

    @field_validator("official")
    @classmethod
    def _official(cls, v: str) -> str:
        if "{tag}" not in v and "@" not in v:
            raise ValueError("name each tag's official image: put {tag} (and {repository}) in it")
        unknown = {f for f in _fields(v) if f not in ("repository", "tag")}
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{sorted(unknown)[0]}}}: {{repository}} and {{tag}} are known"
            )
        return v


def _fields(pattern: str) -> list[str]:
    import string

    return [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]


class ImageList(_Strict):
    apiVersion: Literal["imagegate/v1"]
    kind: Literal["Inventory"]
    defaults: Defaults = Defaults()
    images: list[ImageEntry] = Field(default_factory=list)
    mirrors: list[MirrorEntry] = Field(default_factory=list)
    mirror_sets: list[MirrorSet] = Field(default_factory=list)


@dataclass(frozen=True)
class LoadedImageList:
    image_list: ImageList
    path: Path

    def __len__(self) -> int:
        """The items to check: images and mirror pairs (a mirror set counts once until listed)."""
        inv = self.image_list
        return len(inv.images) + len(inv.mirrors) + len(inv.mirror_sets)


def _rebase(spec: str, folder: Path) -> str:
    """`docker-archive:x.tar` and `oci:dir:tag` written relative to the inventory file."""
    for prefix in ("docker-archive:", "oci:"):
        if spec.startswith(prefix):
            rest = spec[len(prefix) :]
            if rest and not rest.startswith("/"):
                return prefix + str(folder / rest)
    return spec


def _pipeline_path(name: str, folder: Path) -> str:
    looks_like_file = name.endswith((".yaml", ".yml")) or "/" in name
    return str(folder / name) if looks_like_file and not Path(name).is_absolute() else name


MAX_INVENTORY_BYTES = 4 << 20  # thousands of images fit; a larger file is refused before it is read


def load(path: Path) -> LoadedImageList:
    raw = read_named(path, what="inventory", max_bytes=MAX_INVENTORY_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"inventory {path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    # The pipelines' reader: duplicate keys, deep nesting and alias bombs are named errors.
    node, data = read_yaml(text, str(path))
    if not isinstance(data, dict):
        raise UsageError(f"{path}: an inventory is a mapping with apiVersion: imagegate/v1, kind: Inventory")
    try:
        inv = ImageList.model_validate(data)
    except ValidationError as e:
        lines = []
        for item in e.errors():  # in the pipeline file's words: what was expected, what was found
            loc = tuple(item["loc"])
            lines.append(f"{path}:{line_of(node, loc)}: {key_text(loc) or '(top)'}: {message(item)}")
        raise UsageError("invalid inventory:\n  " + "\n  ".join(lines)) from e
    if not inv.images and not inv.mirrors and not inv.mirror_sets:
        raise UsageError(f"{path}: nothing to audit", hint="list `images:`, `mirrors:` or `mirror_sets:`")
    folder = path.parent
    for img in inv.images:
        img.pipeline = _pipeline_path(img.pipeline or inv.defaults.pipeline, folder)
    for m in inv.mirrors:
        m.official, m.mirror = _rebase(m.official, folder), _rebase(m.mirror, folder)
    return LoadedImageList(inv, path)
