"""What the audit works on and produces: installed packages and findings, as frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from imagegate._support.jsontypes import JsonObject


@dataclass(frozen=True)
class Package:
    """One installed distribution; the same name and version may sit in several folders."""

    name: str
    version: str
    locations: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        return canonicalize_name(self.name)


@dataclass(frozen=True)
class Finding:
    id: str
    aliases: tuple[str, ...]
    package: str  # canonical name
    version: str  # as installed
    fixed: tuple[str, ...]  # fix releases above the installed version, lowest first
    severity: str | None = None  # low, medium, high, critical; None when the source gives none
    score: float | None = None  # CVSS base score when known
    summary: str = ""
    locations: tuple[str, ...] = ()

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(x.upper() for x in (self.id, *self.aliases))

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "aliases": list(self.aliases),
            "package": self.package,
            "version": self.version,
            "fixed": list(self.fixed),
            "severity": self.severity,
            "score": self.score,
            "summary": self.summary,
            "locations": list(self.locations),
        }


@dataclass(frozen=True)
class Audit:
    """The findings of one source over a set of packages, and what it could not check."""

    source: str  # "offline", "osv", "pypi"
    where: str  # the folder, or the service
    packages: int
    findings: tuple[Finding, ...]
    problems: tuple[str, ...] = field(default=())
    advisories: int | None = None  # offline: how many advisories the folder held
    as_of: str | None = None  # offline: the newest advisory's `modified` (online: the run's time)


class AuditError(Exception):
    """The audit could not run (an unreadable database, a service error): the stage is ERROR."""


class Unreachable(AuditError):
    """No advisory source is reachable from here: the stage is DEFERRED, never PASS."""
