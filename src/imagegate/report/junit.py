"""JUnit XML for CI test views: one testsuite per run, one testcase per stage.

Written to the subset both Jenkins (the junit plugin; the xunit plugin's junit-10.xsd is the
strictest public schema) and GitLab (unit test reports) read: testsuite name/tests/failures/
errors/skipped/time; FAIL is <failure>, ERROR is <error>, DEFERRED and SKIPPED are <skipped>
with the reason; each stage's stdout/stderr go to <system-out>/<system-err>, and its evidence
files are named with `[[ATTACHMENT|path]]` lines, which GitLab and Jenkins' attachments plugin
turn into links."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from imagegate.domain.results import RunRecord, StageResult, Status
from imagegate.report import view
from imagegate.report.provenance import Provenance

# Characters XML 1.0 cannot carry at all, even escaped: a stage's raw output may contain them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

_ELEMENT = {
    Status.FAIL: "failure",
    Status.ERROR: "error",
    Status.DEFERRED: "skipped",
    Status.SKIPPED: "skipped",
}


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _seconds(s: float) -> str:
    return f"{s:.3f}"


def _testcase(record: RunRecord, stage: StageResult, classname: str) -> ET.Element:
    case = ET.Element("testcase", classname=classname, name=stage.id, time=_seconds(stage.duration_s))
    tag = _ELEMENT.get(stage.status)
    if tag is not None:
        first = view.split_reasons(stage.detail)[:1] or [stage.status.value]
        el = ET.SubElement(case, tag, message=_clean(f"{stage.token}: {first[0]}"[:500]), type=stage.token)
        el.text = _clean(stage.detail)
    out = view.stage_output(record, stage, "stdout.txt")
    # Empty files are not worth a link; the others are named for GitLab/Jenkins to link them.
    attachments = [str(Path(record.attempt_dir) / f.path) for f in stage.evidence if f.size]
    sysout = out + ("\n" if out and not out.endswith("\n") else "")
    sysout += "".join(f"[[ATTACHMENT|{a}]]\n" for a in attachments)
    if sysout:
        ET.SubElement(case, "system-out").text = _clean(sysout)
    err = view.stage_output(record, stage, "stderr.txt")
    if err:
        ET.SubElement(case, "system-err").text = _clean(err)
    return case


def _attestation_case(root: ET.Element, suite: ET.Element, classname: str, provenance: Provenance) -> None:
    """The statement cannot be trusted as shown: one more test, in error."""
    case = ET.SubElement(suite, "testcase", classname=classname, name="attestation", time="0.000")
    lines = provenance.lines()
    el = ET.SubElement(case, "error", message=_clean(provenance.summary()[:500]), type="ATTESTATION_ERROR")
    el.text = _clean("\n".join(lines))
    for counted in (root, suite):
        counted.set("tests", str(int(counted.get("tests", "0")) + 1))
        counted.set("errors", str(int(counted.get("errors", "0")) + 1))


def render(record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None) -> str:
    """`provenance` (a report rendered again from a folder): properties `attestation` and
    `attestation_ok`, a line in the suite's output and, when it is not ok, an `attestation`
    testcase in error, so that a CI view turns red."""
    del base  # attachment paths stay as the run wrote them: CI uploads the evidence folder as is
    count = {st: sum(1 for s in record.stages if s.status is st) for st in Status}
    skipped = count[Status.DEFERRED] + count[Status.SKIPPED]
    totals = {
        "tests": str(len(record.stages)),
        "failures": str(count[Status.FAIL]),
        "errors": str(count[Status.ERROR]),
        "time": _seconds(view.elapsed_s(record)),
    }
    root = ET.Element("testsuites", {"name": "imagegate", **totals})
    # Attribute order as JUnit writers emit it: name, tests, failures, errors, skipped, time.
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": _clean(view.title(record)),
            **{k: totals[k] for k in ("tests", "failures", "errors")},
            "skipped": str(skipped),
            "time": totals["time"],
            "timestamp": record.started_at.replace("Z", "+00:00"),
        },
    )
    props = ET.SubElement(suite, "properties")
    facts = {
        "verdict": record.verdict,
        "image": record.image.reference,
        "config_digest": record.image.config_digest or "",
        "manifest_digest": record.image.manifest_digest or "",
        "pipeline": f"{record.pipeline.get('name', '?')} {record.pipeline.get('version', '')}".strip(),
        "driver": str(record.environment.get("driver") or ""),
        "attempt": record.attempt_dir,
    }
    if note := view.deferred_note(record):
        facts["not_run"] = note  # the verdict token names the deferred stages, not what they held back
    if provenance is not None:
        facts["attestation"] = provenance.summary()
        facts["attestation_ok"] = str(provenance.ok).lower()
    for name, value in facts.items():
        ET.SubElement(props, "property", name=name, value=_clean(value))
    classname = f"imagegate.{record.pipeline.get('name', 'pipeline')}"
    if provenance is not None and not provenance.ok:
        _attestation_case(root, suite, classname, provenance)
    for stage in record.stages:
        suite.append(_testcase(record, stage, classname))
    lines = [f"attestation: {x}" for x in (provenance.lines() if provenance else [])]
    ET.SubElement(suite, "system-out").text = _clean(
        "".join(x + "\n" for x in lines)
        + f"verdict: {view.verdict_line(record)}\nimage: {record.image.reference}\nevidence: {record.attempt_dir}\n"
    )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
