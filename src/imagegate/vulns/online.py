"""Online audit through pip-audit's vulnerability services (OSV or PyPI's JSON API), on the
installed distributions the image reported: no resolver, no pip, no network inside the image.
pip-audit is reached only through `pip_audit_service`."""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import Version

from imagegate.vulns import pip_audit_service
from imagegate.vulns.findings import Audit, AuditError, Finding, Package, Unreachable
from imagegate.vulns.osv import merge_aliases, parse, upgrades
from imagegate.vulns.pip_audit_service import Service

__all__ = ["Service", "audit"]


def audit(packages: Sequence[Package], service: Service, timeout: int = 15) -> Audit:
    """Unreachable when the service cannot be reached at all; AuditError when it answered with an
    error. pip-audit's results carry no severity: findings have severity None."""
    problems: list[str] = []
    findings: list[Finding] = []
    skipped: list[str] = []
    by_key: dict[tuple[str, str], tuple[Package, Version]] = {}
    for pkg in packages:
        version = parse(pkg.version)
        if version is None:
            problems.append(f"{pkg.canonical} {pkg.version}: not a PEP 440 version, not queried")
            continue
        by_key[(pkg.canonical, str(version))] = (pkg, version)
    queried = [(pkg.canonical, version) for pkg, version in by_key.values()]
    try:
        for answer in pip_audit_service.query(service, queried, timeout):
            if answer.skipped is not None:
                skipped.append(f"{answer.name}: {answer.skipped}")
                continue
            pkg = by_key[(answer.name, answer.version)][0]
            findings.extend(_finding(pkg, a) for a in answer.advisories)
    except pip_audit_service.ServiceUnreachable as e:
        raise Unreachable(f"{service} vulnerability service unreachable: {e}") from e
    except pip_audit_service.ServiceFailed as e:
        raise AuditError(f"{service} vulnerability service failed: {e}") from e
    if queried and len(skipped) == len(queried):
        # An answer that knows none of them (a proxy or mirror answering 404) is no audit at all.
        raise Unreachable(
            f"{service} vulnerability service knew none of {len(queried)} distributions: {skipped[0]}"
        )
    return Audit(service, service, len(packages), tuple(merge_aliases(findings)), tuple(problems + skipped))


def _finding(pkg: Package, a: pip_audit_service.Advisory) -> Finding:
    return Finding(
        id=a.id,
        aliases=a.aliases,
        package=pkg.canonical,
        version=pkg.version,
        fixed=upgrades(pkg.version, list(a.fix_versions)),
        summary=" ".join(a.description.split())[:300],
        locations=pkg.locations,
    )
