"""Offline audit from a folder of OSV advisories (YAML or JSON, e.g. a copy of the PyPA advisory
database, or a zip of OSV JSON files), matched with PEP 440 versions as the OSV schema's
evaluation section says: a version is affected when it is listed in `versions` or lies in an
ECOSYSTEM range (introduced / fixed / last_affected events, limit events as upper bounds)."""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagegate._support.jsontypes import JsonMapping
from imagegate.vulns import severity
from imagegate.vulns.findings import Audit, AuditError, Finding, Package
from imagegate.vulns.strict import iterated, mapping

ECOSYSTEM = "PyPI"
_LOADER: type[yaml.SafeLoader | yaml.CSafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)  # the C loader is ~10x faster


class BadRange(ValueError):
    """A range bound that is not a PEP 440 version: that range cannot be evaluated."""


def parse(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def _bound(value: str) -> Version:
    v = parse(value)
    if v is None:
        raise BadRange(f"range bound {value!r} is not a PEP 440 version")
    return v


def in_range(version: Version, events: Sequence[Mapping[str, str]]) -> bool:
    """OSV's IncludedInRanges for one ECOSYSTEM range. `introduced: "0"` sorts before every
    version (even 0.dev0); `limit: "*"` is infinity. BadRange when a bound does not parse."""
    limits = [e["limit"] for e in events if "limit" in e]
    if limits and not any(lim == "*" or version < _bound(lim) for lim in limits):
        return False
    timeline: list[tuple[Version | None, str]] = []
    for e in events:
        for kind in ("introduced", "fixed", "last_affected"):
            if kind in e:
                value = e[kind]
                timeline.append((None if kind == "introduced" and value == "0" else _bound(value), kind))
    # None ("0") first; sorted() is stable, so equal bounds keep the file's order.
    timeline.sort(key=lambda t: (t[0] is not None, t[0] or Version("0")))
    vulnerable = False
    for bound, kind in timeline:
        if kind == "introduced" and (bound is None or version >= bound):
            vulnerable = True
        elif bound is not None and (
            (kind == "fixed" and version >= bound) or (kind == "last_affected" and version > bound)
        ):
            vulnerable = False
    return vulnerable


def in_versions(version: str, listed: Iterable[str]) -> bool:
    """Listed versions compare as PEP 440 versions (3.1.0.rc1 == 3.1.0rc1) where both parse, as
    strings otherwise."""
    v = parse(version)
    for item in listed:
        if item == version:
            return True
        w = parse(item) if v is not None else None
        if w is not None and w == v:
            return True
    return False


@dataclass(frozen=True)
class Match:
    affected: bool
    fixed: tuple[str, ...]  # fixed bounds of the ECOSYSTEM ranges, all of them
    problems: tuple[str, ...] = ()


def match_affected(version: str, affected: JsonMapping) -> Match:
    """Is `version` affected by one `affected[]` entry (its package already matched)?"""
    problems: list[str] = []
    hit = in_versions(version, [str(x) for x in iterated(affected.get("versions") or [])])
    v = parse(version)
    fixed: list[str] = []
    for item in iterated(affected.get("ranges") or []):
        rng = mapping(item)
        if rng.get("type") != "ECOSYSTEM":
            continue  # GIT ranges need the repository; the versions list covers them
        events = [
            {k: str(val) for k, val in mapping(e, "items").items()} for e in iterated(rng.get("events") or [])
        ]
        fixed += [e["fixed"] for e in events if "fixed" in e]
        if hit or v is None:
            continue
        try:
            hit = in_range(v, events)
        except BadRange as e:
            problems.append(str(e))
    if v is None:
        problems.append(f"installed version {version!r} is not PEP 440: matched against version lists only")
    return Match(hit, tuple(fixed), tuple(problems))


@dataclass(frozen=True)
class Advisory:
    id: str
    aliases: tuple[str, ...]
    summary: str
    raw: JsonMapping

    def affected_for(self, canonical: str) -> list[JsonMapping]:
        out = []
        for item in iterated(self.raw.get("affected") or []):
            a = mapping(item)
            pkg = mapping(a.get("package") or {})
            if pkg.get("ecosystem") == ECOSYSTEM and canonicalize_name(str(pkg.get("name", ""))) == canonical:
                out.append(a)
        return out


def _modified(doc: JsonMapping) -> dt.datetime | None:
    """An OSV record's `modified` time (YAML may have parsed it already), in UTC; None if absent
    or unreadable."""
    value = doc.get("modified")
    try:
        when = (
            value
            if isinstance(value, dt.datetime)
            else dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        )
    except ValueError:
        return None
    return when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when.astimezone(dt.timezone.utc)


class AdvisoryDB:
    """The advisories of a folder (or zip), indexed by canonical package name."""

    def __init__(self, where: str, advisories: Iterable[Advisory], problems: Iterable[str] = ()) -> None:
        self.where = where
        self.problems = list(problems)
        self.by_package: dict[str, list[Advisory]] = {}
        self.count = 0
        newest: dt.datetime | None = None
        for adv in advisories:
            self.count += 1
            modified = _modified(adv.raw)
            if modified is not None and (newest is None or modified > newest):
                newest = modified
            names = {
                canonicalize_name(str(mapping(mapping(a).get("package") or {}).get("name", "")))
                for a in iterated(adv.raw.get("affected") or [])
                if mapping(mapping(a).get("package") or {}).get("ecosystem") == ECOSYSTEM
            }
            for name in names:
                self.by_package.setdefault(name, []).append(adv)
        # How fresh the folder is: its newest advisory's `modified` (what a freshness rule reads).
        self.as_of = newest.strftime("%Y-%m-%dT%H:%M:%SZ") if newest else None

    @classmethod
    def load(cls, path: Path) -> AdvisoryDB:
        if not path.exists():
            raise AuditError(f"advisory database {path}: no such folder")
        problems: list[str] = []
        advisories = []
        for name, text in _documents(path):
            try:
                doc = json.loads(text) if name.endswith(".json") else yaml.load(text, Loader=_LOADER)
            except (ValueError, yaml.YAMLError) as e:
                problems.append(f"{name}: unreadable ({type(e).__name__})")
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
                continue  # not an advisory (a schema, an index file)
            if doc.get("withdrawn"):
                continue
            summary = str(doc.get("summary") or doc.get("details") or "").strip()
            advisories.append(
                Advisory(
                    doc["id"],
                    tuple(str(a) for a in doc.get("aliases") or []),
                    " ".join(summary.split())[:300],
                    doc,
                )
            )
        db = cls(str(path), advisories, problems)
        if not db.by_package:
            raise AuditError(
                f"advisory database {path}: no {ECOSYSTEM} advisories found (OSV .yaml/.yml/.json files)"
            )
        return db

    def audit(self, packages: Sequence[Package]) -> Audit:
        findings: list[Finding] = []
        problems = list(self.problems)
        for pkg in packages:
            for adv in self.by_package.get(pkg.canonical, []):
                entries = adv.affected_for(pkg.canonical)
                matches = [match_affected(pkg.version, a) for a in entries]
                problems += [
                    f"{adv.id} ({pkg.canonical} {pkg.version}): {p}" for m in matches for p in m.problems
                ]
                if not any(m.affected for m in matches):
                    continue
                level, score = severity.assess([adv.raw, *entries])
                findings.append(
                    Finding(
                        id=adv.id,
                        aliases=adv.aliases,
                        package=pkg.canonical,
                        version=pkg.version,
                        fixed=upgrades(pkg.version, [f for m in matches for f in m.fixed]),
                        severity=level,
                        score=score,
                        summary=adv.summary,
                        locations=pkg.locations,
                    )
                )
        return Audit(
            "offline",
            self.where,
            len(packages),
            tuple(merge_aliases(findings)),
            tuple(problems),
            self.count,
            self.as_of,
        )


def upgrades(installed: str, fixed: Iterable[str]) -> tuple[str, ...]:
    """The fix releases above the installed version, lowest first (all of them when the
    installed version does not parse)."""
    v = parse(installed)
    keyed = {}
    for f in fixed:
        w = parse(f)
        if w is not None and (v is None or w > v):
            keyed[w] = f
    return tuple(keyed[k] for k in sorted(keyed))


def merge_aliases(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per vulnerability and package: a database that holds both a PYSEC and a GHSA
    record of the same issue (each an alias of the other) reports it once."""
    out: list[Finding] = []
    for f in findings:
        for i, g in enumerate(out):
            if g.package == f.package and g.version == f.version and g.ids & f.ids:
                aliases = tuple(sorted((set(g.aliases) | set(f.aliases) | {f.id}) - {g.id}))
                out[i] = Finding(
                    g.id,
                    aliases,
                    g.package,
                    g.version,
                    upgrades(g.version, [*g.fixed, *f.fixed]),
                    severity.higher(g.severity, f.severity),
                    max(g.score or 0.0, f.score or 0.0) or None,
                    g.summary or f.summary,
                    g.locations,
                )
                break
        else:
            out.append(f)
    return out


def _documents(path: Path) -> Iterator[tuple[str, str]]:
    """(name, text) of every OSV file under a folder, or in a zip (OSV's own export format)."""
    if path.is_file() and path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.filename.endswith((".json", ".yaml", ".yml")):
                    yield info.filename, zf.read(info).decode("utf-8", "replace")
        return
    if not path.is_dir():
        raise AuditError(f"advisory database {path}: not a folder or a .zip of OSV files")
    for p in sorted(path.rglob("*")):
        if p.suffix in (".json", ".yaml", ".yml") and p.is_file():
            yield str(p.relative_to(path)), p.read_text("utf-8", "replace")
