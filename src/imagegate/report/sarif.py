"""SARIF 2.1.0 (OASIS) for code-scanning pages (GitHub's code scanning, GitLab's and Azure's SARIF
viewers): one result per finding a stage made, a rule per kind of finding.

- pip_check: each broken requirement pip named (missing, conflicting, unsupported platform);
- find_spec: each module not found, or found only as a namespace package;
- vulns: each advisory that applies, its rule the advisory (OSV id, aliases, CVSS score as
  GitHub's `security-severity`), an ignored one carried as a suppression with its reason;
- any other stage that did not pass: one result with its detail (deferred ones as notes).

The findings are the stages' own data (a stage inside the image reports what it saw there), so
each result says which stage found it. Code scanning shows a result only at a file of the
repository (a physical location, its path relative to the root, `%SRCROOT%`, and a line), so every
result points at one: the file the user names (`report --sarif-location`, e.g. the Dockerfile),
else the pipeline file the run was given (at the stage's `id:` line), else the attempt's
statement.json; each path is taken relative to the current folder (the repository's root, where
CI runs). Where in the image a finding is (a package's folder) is the result's `imagePath`, and the
image and the package are its logical locations. The run's verdict, attempt and image digest are
the run's properties."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonObject, JsonValue
from imagegate.domain.results import RunRecord, StageResult, Status
from imagegate.report import view
from imagegate.report.provenance import Provenance

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://imagegate.dev"
# Advisory severity -> SARIF level (GitHub shows error/warning/note).
_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note"}
_PIP_KINDS = {
    "missing": "a requirement that is not installed",
    "conflict": "an installed version that a requirement excludes",
    "unsupported_platform": "a distribution built for another platform",
}


def _rule(rule_id: str, text: str, **props: JsonValue) -> JsonObject:
    rule: JsonObject = {"id": rule_id, "name": rule_id, "shortDescription": {"text": text}}
    if props:
        rule["properties"] = props
    return rule


@dataclass(frozen=True)
class Where:
    """The repository file every result points at, relative to the root, and its lines."""

    uri: str
    lines: list[str]

    def line_of(self, stage: StageResult) -> int:
        """The line of the stage's `id:` in a pipeline file, else 1."""
        pattern = re.compile(rf"""^\s*(-\s*)?id:\s*['"]?{re.escape(stage.id)}['"]?\s*(#.*)?$""")
        return next((n for n, line in enumerate(self.lines, 1) if pattern.match(line)), 1)


def _relative(path: str) -> str:
    """`path` relative to the current folder (the repository's root in CI); a file outside it
    by its name alone, as code scanning shows no file outside the repository."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full)
    return os.path.basename(full) if rel.startswith("..") else rel


def where(record: RunRecord, location: str | None = None) -> Where:
    """The file named, else the pipeline's file (a built-in has none), else statement.json."""
    source = str(record.pipeline.get("source") or "")
    from_pipeline = location is None and bool(source) and not source.startswith("builtin:")
    chosen = location or (source if from_pipeline else os.path.join(record.attempt_dir, "statement.json"))
    lines: list[str] = []
    if from_pipeline:
        # moved or unreadable since the run: line 1
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = Path(chosen).read_text(encoding="utf-8").splitlines()
    return Where(quote(_relative(chosen).replace(os.sep, "/"), safe="/@"), lines)


def _location(record: RunRecord, at: Where, stage: StageResult, name: str | None = None) -> JsonObject:
    """The repository file `at` (the stage's line in a pipeline file), and the image (and the
    package, when there is one) as logical locations."""
    logical: list[JsonValue] = [{"fullyQualifiedName": record.image.reference, "kind": "module"}]
    if name:
        logical.append({"fullyQualifiedName": name, "kind": "package"})
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": at.uri, "uriBaseId": "%SRCROOT%"},
            "region": {"startLine": at.line_of(stage)},
        },
        "logicalLocations": logical,
    }


def _result(
    rule_id: str,
    level: str,
    text: str,
    stage: StageResult,
    location: JsonObject,
    image_path: str | None = None,
    **extra: JsonValue,
) -> JsonObject:
    """`image_path`: where in the image the finding is, the last of its properties."""
    properties: JsonObject = {"stage": stage.id, "probe": stage.probe, "status": stage.status.value}
    if image_path is not None:
        properties["imagePath"] = image_path
    return {
        "ruleId": rule_id,
        "level": level,
        "message": {"text": text},
        "locations": [location],
        "properties": properties,
        **extra,
    }


def _dicts(value: object) -> Iterator[Mapping[str, object]]:
    """The mappings of a list from a stage's data (which an image wrote: anything else is passed)."""
    for item in value if isinstance(value, list) else []:
        if isinstance(item, Mapping):
            yield item


def _pip_check(
    record: RunRecord, stage: StageResult, rules: dict[str, JsonObject], at: Where
) -> Iterator[JsonObject]:
    for p in _dicts(stage.data.get("problems")):
        kind = str(p.get("kind"))
        if kind not in _PIP_KINDS:
            continue
        rule_id = f"imagegate/pip-check/{kind.replace('_', '-')}"
        rules.setdefault(rule_id, _rule(rule_id, f"pip check: {_PIP_KINDS[kind]}"))
        project = str(p.get("project") or "")
        level = "note" if p.get("ignored") else "error"
        text = str(p.get("line") or kind) + (" (ignored by the pipeline)" if p.get("ignored") else "")
        yield _result(rule_id, level, text, stage, _location(record, at, stage, project or None))


def _find_spec(
    record: RunRecord, stage: StageResult, rules: dict[str, JsonObject], at: Where
) -> Iterator[JsonObject]:
    for m in _dicts(stage.data.get("modules")):
        if m.get("found") and not m.get("reason"):
            continue
        kind = "missing-module" if not m.get("found") else "namespace-only"
        rule_id = f"imagegate/find-spec/{kind}"
        what = (
            "a module the pipeline asserts is not importable"
            if kind == "missing-module"
            else ("a module found only as a namespace package")
        )
        rules.setdefault(rule_id, _rule(rule_id, f"find_spec: {what}"))
        module = str(m.get("module"))
        yield _result(
            rule_id, "error", f"{module}: {m.get('reason')}", stage, _location(record, at, stage, module)
        )


def _vulns(
    record: RunRecord, stage: StageResult, rules: dict[str, JsonObject], at: Where
) -> Iterator[JsonObject]:
    for f in _dicts(stage.data.get("findings")):
        fid, package, version = str(f.get("id")), str(f.get("package")), str(f.get("version"))
        aliases = [str(a) for a in view.each(f.get("aliases")) if isinstance(a, str)]
        score = f.get("score")
        props: JsonObject = {"tags": ["security", "vulnerability"]}
        if isinstance(score, int | float) and not isinstance(score, bool):
            props["security-severity"] = f"{float(score):.1f}"  # GitHub's severity, from the CVSS score
        rule = _rule(fid, str(f.get("summary") or fid)[:1000], **props)
        rule["helpUri"] = f"https://osv.dev/vulnerability/{quote(fid)}"
        rules.setdefault(fid, rule)
        fixed = [str(x) for x in view.each(f.get("fixed"))]
        text = f"{package} {version}: {fid}" + (f" ({', '.join(aliases)})" if aliases else "")
        text += f", fixed in {fixed[0]}" if fixed else ", no fixed release"
        paths = [str(x) for x in view.each(f.get("locations")) if isinstance(x, str)]
        extra: JsonObject = {}
        ignore = f.get("ignore")
        if isinstance(ignore, Mapping):
            extra["suppressions"] = [
                {
                    "kind": "external",
                    "justification": f"{ignore.get('reason')} (until {ignore.get('expires')})",
                }
            ]
        level = _LEVEL.get(str(f.get("severity")), "warning")
        found_at = _location(record, at, stage, package)
        # where in the image (paths) is a property: it is no file of the repository
        yield _result(fid, level, text, stage, found_at, paths[0] if paths else None, **extra)


_FINDINGS = {"pip_check": _pip_check, "find_spec": _find_spec, "vulns": _vulns}


def _stage_result(
    record: RunRecord, stage: StageResult, rules: dict[str, JsonObject], at: Where
) -> JsonObject:
    rule_id = f"imagegate/stage/{stage.probe}"
    rules.setdefault(rule_id, _rule(rule_id, f"a {stage.probe} stage did not pass"))
    level = "note" if stage.status is Status.DEFERRED else "error"
    text = f"{stage.token}: " + ("; ".join(view.split_reasons(stage.detail)) or stage.status.value)
    return _result(rule_id, level, text, stage, _location(record, at, stage))


def render(
    record: RunRecord,
    base: Path | None = None,
    *,
    provenance: Provenance | None = None,
    location: str | None = None,
) -> str:
    """`location`: the repository file every result points at (None: the pipeline file, else the
    attempt's statement.json)."""
    del base  # the locations are relative to the repository's root, not to the report
    at = where(record, location)
    rules: dict[str, JsonObject] = {}
    results: list[JsonValue] = []
    for stage in record.stages:
        found = list(_FINDINGS[stage.probe](record, stage, rules, at)) if stage.probe in _FINDINGS else []
        results += found
        if not found and stage.status in (Status.FAIL, Status.ERROR, Status.DEFERRED):
            results.append(_stage_result(record, stage, rules, at))
    properties: JsonObject = {
        "verdict": record.verdict,
        "attempt": record.attempt_id,
        "image": record.image.reference,
        "manifestDigest": record.image.manifest_digest,
        "configDigest": record.image.config_digest,
        "pipeline": j.freeze_object(record.pipeline),  # JSON as recorded: the same text
    }
    if provenance is not None:
        properties["attestation"] = list[JsonValue](provenance.lines())
    run: JsonObject = {
        "tool": {
            "driver": {
                "name": "imagegate",
                "version": record.imagegate_version,
                "informationUri": INFORMATION_URI,
                "rules": list[JsonValue](rules.values()),
            }
        },
        # One category per pipeline and image: code scanning keeps each one's alerts apart.
        "automationDetails": {"id": f"imagegate/{record.pipeline.get('name')}/{record.image.reference}/"},
        "invocations": [
            {
                "executionSuccessful": record.verdict != "ERROR",
                "startTimeUtc": record.started_at,
                "endTimeUtc": record.finished_at,
            }
        ],
        "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "the repository's root"}}},
        "results": results,
        "properties": properties,
    }
    return json.dumps({"version": "2.1.0", "$schema": SCHEMA, "runs": [run]}, indent=2) + "\n"
