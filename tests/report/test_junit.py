"""JUnit XML as Jenkins and GitLab read it: valid against the Jenkins xunit plugin's JUnit
schema, counts that match the stages, deferred stages skipped with their reason, output attached."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from lxml import etree

from imagegate.report import formats, load
from tests.helpers import imagegate

XSD = etree.XMLSchema(etree.parse(str(Path(__file__).parent / "data" / "junit-10.xsd")))


def validate(xml: str) -> etree._Element:
    doc = etree.fromstring(xml.encode("utf-8"))
    assert XSD.validate(doc), XSD.error_log
    return doc


def test_every_status_validates_and_counts(mixed_attempt: Path) -> None:
    doc = validate(formats.render(load.load_attempt(mixed_attempt), "junit"))
    suite = doc.find("testsuite")
    assert suite is not None
    assert suite.get("name") == "imagegate vllm: example/vllm:0.11"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "6",
        "2",
        "1",
        "2",
    )
    assert float(suite.get("time", "x")) == pytest.approx(3.118)
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["pip_check", "find_spec", "gpu_cli", "av_roundtrip", "sbom", "layers"]
    assert all(c.get("classname") == "imagegate.vllm" for c in cases.values())  # GitLab's suite name
    deferred = cases["gpu_cli"].find("skipped")
    assert deferred is not None and "requires gpu, not present here" in (deferred.get("message") or "")
    assert cases["gpu_cli"].findtext("system-err") == "RuntimeError: Failed to infer device type\n"
    assert cases["pip_check"].find("failure") is not None
    assert cases["av_roundtrip"].find("error") is not None
    assert cases["find_spec"].find("failure") is None and cases["find_spec"].find("skipped") is None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "FAIL"


def test_stage_output_is_attached_and_made_xml_safe(mixed_attempt: Path) -> None:
    doc = validate(formats.render(load.load_attempt(mixed_attempt), "junit"))
    out = doc.find("testsuite/testcase[@name='pip_check']/system-out")
    assert out is not None and out.text is not None
    # ESC and NUL cannot be carried by XML 1.0: replaced, the rest of the line kept.
    assert "pip says\ufffd[31m red\ufffd" in out.text
    attachment = next(line for line in out.text.splitlines() if line.startswith("[[ATTACHMENT|"))
    assert Path(attachment[len("[[ATTACHMENT|") : -2]).is_file()


def test_schema_check_can_fail(mixed_attempt: Path) -> None:
    xml = formats.render(load.load_attempt(mixed_attempt), "junit")
    broken = etree.fromstring(xml.encode())
    suite = broken.find("testsuite")
    assert suite is not None
    del suite.attrib["tests"]  # Jenkins requires it
    assert not XSD.validate(broken)


def test_real_run_report_validates_and_rerenders_identically(here_run: Path) -> None:
    written = (here_run / "reports/junit.xml").read_text()
    doc = validate(written)
    assert [c.get("name") for c in doc.iter("testcase")] == ["pip_check", "find_spec"]
    attempt = next((here_run / "runs").glob("*/*/"))
    r = imagegate("report", str(attempt.relative_to(here_run)), "--format", "junit", cwd=here_run)
    assert r.returncode == 0, r.stderr
    # The same report, with what vouches for it: a property and a line (nothing was checked).
    said = "signed; signature not checked — pass --key PUB to check it"
    extra = [
        f'      <property name="attestation" value="{said}" />\n',
        '      <property name="attestation_ok" value="true" />\n',
        f"attestation: {said}\n",
    ]
    # The run's own report says what vouches for it too: its signature, checked right after signing.
    checked = re.search(r"signature verified with key sha256:[0-9a-f]{64}", written)
    assert checked, written
    rerendered = r.stdout
    for line in extra:
        assert line in rerendered
        rerendered = rerendered.replace(line, line.replace(said, checked.group(0)), 1)
    assert rerendered == written


def test_junit_to_stdout_keeps_stdout_to_itself(
    mixed_attempt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--report junit=-`: stdout is one XML document; the other reports still go to files."""
    monkeypatch.chdir(tmp_path)
    record = load.load_attempt(mixed_attempt)
    out, err = io.StringIO(), io.StringIO()
    specs = formats.parse_specs(["junit=-", "markdown=m.md"])
    assert formats.write_reports(record, specs, stdout=out, stderr=err, env={}) is True
    validate(out.getvalue())
    assert (tmp_path / "m.md").read_text().startswith("## ")
    assert formats.write_reports(record, [("markdown", Path("n.md"))], stdout=out, env={}) is False


def test_two_reports_on_stdout_are_refused() -> None:
    from imagegate.errors import UsageError

    with pytest.raises(UsageError, match="only one report"):
        formats.parse_specs(["junit=-", "json=-"])


def test_reports_never_land_in_an_attempt_folder(images: dict[str, str], tmp_path: Path) -> None:
    """Evidence is never overwritten: `--report` and `report -o` refuse an attempt folder."""
    from tests.helpers import imagegate

    out = tmp_path / "runs"
    first = imagegate("run", images["python"], "-p", "python", "-o", str(out), "--no-sign")
    assert first.returncode == 0, first.stderr
    (attempt,) = [p for p in out.glob("sha256-*/*") if p.is_dir()]
    statement = attempt / "statement.json"
    before = statement.read_bytes()
    again = imagegate(
        "run", images["python"], "-p", "python", "-o", str(out), "--no-sign",
        "--report", f"json={statement}",
    )  # fmt: skip
    assert again.returncode == 3 and "whose files are evidence" in again.stderr, again.stderr
    assert len([p for p in out.glob("sha256-*/*") if p.is_dir()]) == 1  # refused before running
    rendered = imagegate("report", str(attempt), "--format", "junit", "-o", str(attempt / "stages" / "x.xml"))
    assert rendered.returncode == 3 and "whose files are evidence" in rendered.stderr, rendered.stderr
    assert statement.read_bytes() == before and not (attempt / "stages" / "x.xml").exists()
