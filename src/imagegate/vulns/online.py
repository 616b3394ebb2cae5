"""Online audit through pip-audit's vulnerability services (OSV or PyPI's JSON API), on the
inventory the image reported: no resolver, no pip, no network inside the image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from imagegate.vulns.model import Audit, AuditError, Finding, Package, Unreachable
from imagegate.vulns.osv import merge_aliases, parse, upgrades

Service = Literal["osv", "pypi"]


def _service(name: Service, timeout: int) -> Any:
    from pip_audit._service import OsvService, PyPIService

    if name == "osv":
        return OsvService(timeout=timeout)
    return PyPIService(timeout=timeout)


def audit(packages: Sequence[Package], service: Service, timeout: int = 15) -> Audit:
    """Unreachable when the service cannot be reached at all; AuditError when it answered with an
    error. pip-audit's results carry no severity: findings have severity None."""
    import requests
    from pip_audit._service import ConnectionError as PAConnectionError
    from pip_audit._service import ResolvedDependency, ServiceError

    svc = _service(service, timeout)
    problems: list[str] = []
    findings: list[Finding] = []
    skipped: list[str] = []
    by_key: dict[tuple[str, str], Package] = {}
    specs = []
    for pkg in packages:
        version = parse(pkg.version)
        if version is None:
            problems.append(f"{pkg.canonical} {pkg.version}: not a PEP 440 version, not queried")
            continue
        by_key[(pkg.canonical, str(version))] = pkg
        specs.append(ResolvedDependency(name=pkg.canonical, version=version))
    try:
        for dep, results in svc.query_all(iter(specs)):
            if dep.is_skipped():
                skipped.append(f"{dep.canonical_name}: {dep.skip_reason}")
                continue
            pkg = by_key[(dep.canonical_name, str(dep.version))]
            for r in results:
                findings.append(
                    Finding(
                        id=str(r.id),
                        aliases=tuple(sorted(str(a) for a in r.aliases)),
                        package=pkg.canonical,
                        version=pkg.version,
                        fixed=upgrades(pkg.version, [str(v) for v in r.fix_versions]),
                        summary=" ".join(str(r.description).split())[:300],
                        locations=pkg.locations,
                    )
                )
    except (PAConnectionError, requests.ConnectionError, requests.Timeout) as e:
        raise Unreachable(f"{service} vulnerability service unreachable: {_reason(e)}") from e
    except (ServiceError, requests.RequestException) as e:
        raise AuditError(f"{service} vulnerability service failed: {_reason(e)}") from e
    if specs and len(skipped) == len(specs):
        # An answer that knows none of them (a proxy or mirror answering 404) is no audit at all.
        raise Unreachable(
            f"{service} vulnerability service knew none of {len(specs)} distributions: {skipped[0]}"
        )
    return Audit(service, service, len(packages), tuple(merge_aliases(findings)), tuple(problems + skipped))


def _reason(e: BaseException) -> str:
    # pip-audit wraps the requests error; the innermost one says what happened (DNS, refused).
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return f"{type(e).__name__}: {str(e)[:200]}"
