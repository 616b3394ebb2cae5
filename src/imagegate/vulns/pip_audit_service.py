"""The one door to pip-audit's vulnerability services (OSV, PyPI's JSON API).

pip-audit has no public Python API: its services live in the private `pip_audit._service`
package. Everything imagegate uses of it is named in this module and nowhere else, turned into
the frozen records below, and checked by tests/vulns/test_pip_audit_service.py (names and
signatures), which fails loudly on a pip-audit that changed them. pyproject.toml pins the range
that test passed on: `SUPPORTED`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from imagegate.errors import describe_exception

Service = Literal["osv", "pypi"]

# The pip-audit releases whose private service interface matches what this module uses.
SUPPORTED = ">=2.7,<2.11"


@dataclass(frozen=True)
class Advisory:
    id: str
    aliases: tuple[str, ...]
    fix_versions: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class Answer:
    """The service's answer for one distribution: `skipped` says why it has none."""

    name: str  # canonical
    version: str
    advisories: tuple[Advisory, ...]
    skipped: str | None = None


class ServiceUnreachable(Exception):
    """The service could not be reached at all (DNS, refused, timed out)."""


class ServiceFailed(Exception):
    """The service answered with an error."""


def query(service: Service, distributions: Sequence[tuple[str, Version]], timeout: int) -> Iterator[Answer]:
    """Ask `service` about each (canonical name, version), in one pass."""
    import requests
    from pip_audit._service import ConnectionError as PAConnectionError
    from pip_audit._service import OsvService, PyPIService, ResolvedDependency, ServiceError

    svc = OsvService(timeout=timeout) if service == "osv" else PyPIService(timeout=timeout)
    specs = (ResolvedDependency(name=name, version=version) for name, version in distributions)
    try:
        for dep, results in svc.query_all(specs):
            if dep.is_skipped():
                yield Answer(dep.canonical_name, "", (), skipped=str(dep.skip_reason))
                continue
            yield Answer(dep.canonical_name, str(dep.version), tuple(_advisory(r) for r in results))
    except (PAConnectionError, requests.ConnectionError, requests.Timeout) as e:
        raise ServiceUnreachable(_reason(e)) from e
    except (ServiceError, requests.RequestException) as e:
        raise ServiceFailed(_reason(e)) from e


def _advisory(r: object) -> Advisory:
    # r: pip_audit._service.VulnerabilityResult (untyped here: pip-audit ships no stubs we rely on)
    return Advisory(
        id=str(r.id),  # type: ignore[attr-defined]
        aliases=tuple(sorted(str(a) for a in r.aliases)),  # type: ignore[attr-defined]
        fix_versions=tuple(str(v) for v in r.fix_versions),  # type: ignore[attr-defined]
        description=str(r.description),  # type: ignore[attr-defined]
    )


def _reason(e: BaseException) -> str:
    # pip-audit wraps the requests error; the innermost one says what happened (DNS, refused).
    return describe_exception(e)[:200]
