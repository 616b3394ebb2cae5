"""SARIF 2.1.0 (OASIS) for code-scanning pages (GitHub's code scanning, GitLab's and Azure's SARIF
viewers): one result per finding a stage made, a rule per kind of finding.

- pip_check: each broken requirement pip named (missing, conflicting, unsupported platform);
- find_spec: each module not found, or found only as a namespace package;
- vulns: each advisory that applies, its rule the advisory (OSV id, aliases, CVSS score as
  GitHub's `security-severity`), an ignored one carried as a suppression with its reason;
- any other stage that did not pass: one result with its detail (deferred ones as notes).

The findings are the stages' own data (a stage inside the image reports what it saw there), so
each result says which stage found it. Locations are in the image: a package's folder where the
stage knows it, else the image itself (`uriBaseId` IMAGE); each result also names the image as a
logical location. The run's verdict, attempt and image digest are the run's properties."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from imagegate.model import RunRecord, StageResult, Status
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


def _rule(rule_id: str, text: str, **props: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {"id": rule_id, "name": rule_id, "shortDescription": {"text": text}}
    if props:
        rule["properties"] = props
    return rule


def _location(record: RunRecord, path: str | None = None, name: str | None = None) -> dict[str, Any]:
    """A place in the image: a folder the stage named, else the image, and the image (and the
    package, when there is one) as logical locations."""
    uri = quote(path.lstrip("/") if path else record.image.reference, safe="/@")
    logical = [{"fullyQualifiedName": record.image.reference, "kind": "module"}]
    if name:
        logical.append({"fullyQualifiedName": name, "kind": "package"})
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": uri, "uriBaseId": "IMAGE"},
            "region": {"startLine": 1},
        },
        "logicalLocations": logical,
    }


def _result(
    rule_id: str, level: str, text: str, stage: StageResult, location: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "ruleId": rule_id,
        "level": level,
        "message": {"text": text},
        "locations": [location],
        "properties": {"stage": stage.id, "probe": stage.probe, "status": stage.status.value},
        **extra,
    }


def _dicts(value: Any) -> Iterator[Mapping[str, Any]]:
    """The mappings of a list from a stage's data (which an image wrote: anything else is passed)."""
    for item in value if isinstance(value, list) else []:
        if isinstance(item, Mapping):
            yield item


def _pip_check(record: RunRecord, stage: StageResult, rules: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in _dicts(stage.data.get("problems")):
        kind = str(p.get("kind"))
        if kind not in _PIP_KINDS:
            continue
        rule_id = f"imagegate/pip-check/{kind.replace('_', '-')}"
        rules.setdefault(rule_id, _rule(rule_id, f"pip check: {_PIP_KINDS[kind]}"))
        project = str(p.get("project") or "")
        level = "note" if p.get("ignored") else "error"
        text = str(p.get("line") or kind) + (" (ignored by the pipeline)" if p.get("ignored") else "")
        yield _result(rule_id, level, text, stage, _location(record, name=project or None))


def _find_spec(record: RunRecord, stage: StageResult, rules: dict[str, Any]) -> Iterator[dict[str, Any]]:
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
        yield _result(rule_id, "error", f"{module}: {m.get('reason')}", stage, _location(record, name=module))


def _vulns(record: RunRecord, stage: StageResult, rules: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for f in _dicts(stage.data.get("findings")):
        fid, package, version = str(f.get("id")), str(f.get("package")), str(f.get("version"))
        aliases = [str(a) for a in f.get("aliases") or [] if isinstance(a, str)]
        score = f.get("score")
        props: dict[str, Any] = {"tags": ["security", "vulnerability"]}
        if isinstance(score, int | float) and not isinstance(score, bool):
            props["security-severity"] = f"{float(score):.1f}"  # GitHub's severity, from the CVSS score
        rule = _rule(fid, str(f.get("summary") or fid)[:1000], **props)
        rule["helpUri"] = f"https://osv.dev/vulnerability/{quote(fid)}"
        rules.setdefault(fid, rule)
        fixed = [str(x) for x in f.get("fixed") or []]
        text = f"{package} {version}: {fid}" + (f" ({', '.join(aliases)})" if aliases else "")
        text += f", fixed in {fixed[0]}" if fixed else ", no fixed release"
        where = [str(x) for x in f.get("locations") or [] if isinstance(x, str)]
        extra: dict[str, Any] = {}
        ignore = f.get("ignore")
        if isinstance(ignore, Mapping):
            extra["suppressions"] = [
                {
                    "kind": "external",
                    "justification": f"{ignore.get('reason')} (until {ignore.get('expires')})",
                }
            ]
        level = _LEVEL.get(str(f.get("severity")), "warning")
        yield _result(
            fid, level, text, stage, _location(record, where[0] if where else None, package), **extra
        )


_FINDINGS = {"pip_check": _pip_check, "find_spec": _find_spec, "vulns": _vulns}


def _stage_result(record: RunRecord, stage: StageResult, rules: dict[str, Any]) -> dict[str, Any]:
    rule_id = f"imagegate/stage/{stage.probe}"
    rules.setdefault(rule_id, _rule(rule_id, f"a {stage.probe} stage did not pass"))
    level = "note" if stage.status is Status.DEFERRED else "error"
    text = f"{stage.token}: " + ("; ".join(view.split_reasons(stage.detail)) or stage.status.value)
    return _result(rule_id, level, text, stage, _location(record))


def render(record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None) -> str:
    del base  # nothing is linked: the locations are in the image
    rules: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    for stage in record.stages:
        found = list(_FINDINGS[stage.probe](record, stage, rules)) if stage.probe in _FINDINGS else []
        results += found
        if not found and stage.status in (Status.FAIL, Status.ERROR, Status.DEFERRED):
            results.append(_stage_result(record, stage, rules))
    properties: dict[str, Any] = {
        "verdict": record.verdict,
        "attempt": record.attempt_id,
        "image": record.image.reference,
        "manifestDigest": record.image.manifest_digest,
        "configDigest": record.image.config_digest,
        "pipeline": dict(record.pipeline),
    }
    if provenance is not None:
        properties["attestation"] = provenance.lines()
    run = {
        "tool": {
            "driver": {
                "name": "imagegate",
                "version": record.imagegate_version,
                "informationUri": INFORMATION_URI,
                "rules": list(rules.values()),
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
        "originalUriBaseIds": {"IMAGE": {"description": {"text": f"the root of {record.image.reference}"}}},
        "results": results,
        "properties": properties,
    }
    return json.dumps({"version": "2.1.0", "$schema": SCHEMA, "runs": [run]}, indent=2) + "\n"
