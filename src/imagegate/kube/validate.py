"""Rendered objects checked against the official Kubernetes JSON schemas (kubernetes-validate,
strict: unknown fields are errors) for a stated Kubernetes version."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes_validate import utils as kv_utils

from imagegate.errors import UsageError

DEFAULT_VERSION = "1.30"


def supported_versions() -> list[str]:
    return [str(v) for v in kv_utils.all_versions()]


def validate(objects: Iterable[dict[str, Any]], version: str = DEFAULT_VERSION) -> list[str]:
    """Problems, one line each ("job/NAME: spec.template...: message"); empty when valid."""
    problems: list[str] = []
    for obj in objects:
        where = f"{str(obj.get('kind', '?')).lower()}/{obj.get('metadata', {}).get('name', '?')}"
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


def check(objects: Iterable[dict[str, Any]], version: str = DEFAULT_VERSION) -> None:
    """`validate`, as an input error: the options given are what made the objects invalid."""
    problems = validate(objects, version)
    if problems:
        raise UsageError(
            f"the rendered objects do not validate against Kubernetes {version}: " + "; ".join(problems),
            hint="check the values given to --name, --node-selector, --toleration",
        )
