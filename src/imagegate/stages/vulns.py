"""The outside `vulns` stage: audit the inventory the image reported, offline from an OSV folder
(`--advisory-db` or the stage's `advisory_db`) or online through pip-audit, then apply the
pipeline's policy. No database and no reachable service gives DEFERRED, never PASS."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from pydantic import BaseModel

from imagegate._support.jsontypes import JsonObject, JsonValue
from imagegate.domain.results import Status
from imagegate.pipeline.params import VulnsParams
from imagegate.stages import Outcome, OutsideContext
from imagegate.vulns import inventory, online, policy
from imagegate.vulns.findings import Audit, AuditError, Finding, Unreachable
from imagegate.vulns.osv import AdvisoryDB

DETAIL_FINDINGS = 20  # the rest is in findings.json
DATA_PROBLEMS = 50


def run_vulns_stage(ctx: OutsideContext, params: BaseModel, today: dt.date | None = None) -> Outcome:
    assert isinstance(params, VulnsParams)
    inv = next((r for r in reversed(list(ctx.inside_results.values())) if r.probe == "inventory"), None)
    if inv is None or inv.status is not Status.PASS:
        why = "no inventory stage ran" if inv is None else f"the inventory stage is {inv.status.value}"
        return Outcome(Status.ERROR, f"{why}: add a stage with probe: inventory and list it in needs")
    packages = inventory.packages(inv.data)
    db = ctx.advisory_db or params.advisory_db
    try:
        if db is not None:
            audit = AdvisoryDB.load(Path(db)).audit(packages)
        elif params.service != "none":
            audit = online.audit(packages, params.service, params.service_timeout)
        else:
            return Outcome(
                Status.DEFERRED,
                "no advisory database (--advisory-db DIR) and service: none: nothing to audit against",
            )
    except Unreachable as e:
        return Outcome(Status.DEFERRED, f"{e}; give --advisory-db DIR for an offline audit")
    except AuditError as e:
        return Outcome(Status.ERROR, str(e))
    decision = policy.decide(audit.findings, params, today)
    data = _data(audit, decision, params)
    (ctx.stage_dir / "findings.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    data["problems"] = list(audit.problems[:DATA_PROBLEMS])  # as _data lists them, cut
    return Outcome(
        Status.FAIL if decision.failed else Status.PASS, _detail(audit, decision, params.fail_on), data
    )


def _finding(f: Finding) -> str:
    aliases = f" ({', '.join(f.aliases)})" if f.aliases else ""
    fix = f", fixed in {f.fixed[0]}" if f.fixed else ", no fixed release"
    sev = f", {f.severity}" if f.severity else ""
    return f"{f.package} {f.version}: {f.id}{aliases}{sev}{fix}"


def _detail(audit: Audit, d: policy.Decision, fail_on: str) -> str:
    where = f"{audit.source}: {audit.advisories} advisories" if audit.advisories else audit.source
    parts = []
    if d.counted:
        pkgs = len({f.package for f in d.counted})
        parts.append(
            f"{_n(len(d.counted), 'advisory', 'advisories')} in {pkgs} of {audit.packages} distributions ({where})"
        )
        parts += [_finding(f) for f in d.counted[:DETAIL_FINDINGS]]
        if len(d.counted) > DETAIL_FINDINGS:
            parts.append(f"and {len(d.counted) - DETAIL_FINDINGS} more in findings.json")
    else:
        parts.append(f"no advisories to act on in {audit.packages} distributions ({where})")
    parts += [
        f"ignore of {i.id} expired on {i.expires.isoformat()} (reason was: {i.reason}), renew or remove it"
        for i in d.expired
    ]
    if d.ignored:
        parts.append(f"{len(d.ignored)} ignored: " + ", ".join(f"{f.id} ({f.package})" for f, _ in d.ignored))
    if audit.problems:
        parts.append(f"{len(audit.problems)} notes on what could not be fully checked (findings.json)")
    if d.below:
        parts.append(f"{len(d.below)} below the fail_on threshold ({fail_on})")
    return "; ".join(parts)


def _data(audit: Audit, d: policy.Decision, params: VulnsParams) -> JsonObject:
    findings: list[JsonValue] = []
    for f in audit.findings:
        item: JsonObject = {**f.to_json(), "state": d.state(f)}
        ig = d.ignore_of(f)
        if ig is not None:
            item["ignore"] = {"reason": ig.reason, "expires": ig.expires.isoformat()}
        findings.append(item)
    return {
        "source": audit.source,
        "where": audit.where,
        "advisories": audit.advisories,
        "advisories_as_of": audit.as_of,
        "packages": audit.packages,
        "fail_on": params.fail_on,
        "counted": len(d.counted),
        "findings": findings,
        "expired_ignores": [i.model_dump(mode="json", exclude_none=True) for i in d.expired],
        "problems": list(audit.problems),
    }


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"
