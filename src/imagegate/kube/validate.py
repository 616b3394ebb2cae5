"""Rendered objects checked against the official Kubernetes JSON schemas (kubernetes-validate,
strict: unknown fields are errors) for a stated Kubernetes version. kubernetes-validate carries
every Kubernetes version's schemas (about 100 MB): it comes with the `kube` extra, which only
`pod render` and `pod run` need."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from types import ModuleType

from imagegate._support import jsontypes
from imagegate._support.jsontypes import JsonObject
from imagegate.errors import UsageError

DEFAULT_VERSION = "1.30"
EXTRA = "imagegate[kube]"


def _kv() -> ModuleType:
    try:
        utils: ModuleType = importlib.import_module("kubernetes_validate.utils")
    except ImportError as e:
        raise UsageError(
            f"the Pod's objects are checked against Kubernetes' schemas, which need the kube extra ({e.name} is not installed)",
            hint=f"pip install '{EXTRA}' (pipx: pipx inject imagegate kubernetes-validate; uv: uv tool install '{EXTRA}')",
        ) from None
    # kubernetes-validate parses the kind's schema and the version's definitions (megabytes of
    # JSON) on every call, 80 % of a Job's check: a fleet renders the same three kinds per node
    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.lru_cache(maxsize=16)(utils.schema_contents)  # type: ignore[attr-defined]
    return utils


def supported_versions() -> list[str]:
    return [str(v) for v in _kv().all_versions()]


def validate(objects: Iterable[JsonObject], version: str = DEFAULT_VERSION) -> list[str]:
    """Problems, one line each ("job/NAME: spec.template...: message"); empty when valid."""
    kv_utils = _kv()
    problems: list[str] = []
    for obj in objects:
        where = f"{str(obj.get('kind', '?')).lower()}/{jsontypes.obj(obj.get('metadata')).get('name', '?')}"
        try:
            kv_utils.validate(obj, version, strict=True)
        except kv_utils.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{where}: {path or '(top)'}: {e.message}")
        except kv_utils.VersionNotSupportedError as e:
            raise UsageError(
                f"Kubernetes {version}: no schemas for it",
                hint=f"supported: {', '.join(supported_versions())}",
            ) from e
        except kv_utils.SchemaNotFoundError as e:
            problems.append(f"{where}: {e.message}")
    return problems


def check(objects: Iterable[JsonObject], version: str = DEFAULT_VERSION) -> None:
    """`validate`, as an input error: the options given are what made the objects invalid."""
    problems = validate(objects, version)
    if problems:
        raise UsageError(
            f"the rendered objects do not validate against Kubernetes {version}: " + "; ".join(problems),
            hint="check the values given to --name, --node-selector, --toleration",
        )
