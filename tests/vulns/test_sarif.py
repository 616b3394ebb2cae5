"""SARIF from a real run (a known-vulnerable image, a module it lacks): the results code scanning
shows, valid by Microsoft's SARIF validator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.report.sarif_check import problems
from tests.vulns.conftest import imagegate

pytestmark = pytest.mark.engine


def test_advisories_and_a_missing_module_are_results(
    vuln_images: dict[str, str], advisory_db: Path, tmp_path: Path
) -> None:
    r = imagegate(
        "run", vuln_images["vulnerable"], "-p", "python", "-m", "requests", "-m", "no_such_module",
        "--advisory-db", str(advisory_db), "--no-sign", "-o", str(tmp_path / "runs"),
        "--report", f"sarif={tmp_path / 'report.sarif'}",
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    text = (tmp_path / "report.sarif").read_text()
    assert problems(text, tmp_path / "check") == []
    (run,) = json.loads(text)["runs"]
    results = {(x["ruleId"], x["properties"]["stage"]): x for x in run["results"]}
    missing = results["imagegate/find-spec/missing-module", "find_spec"]
    assert missing["level"] == "error" and missing["message"]["text"].startswith("no_such_module: ")
    advisory = results["PYSEC-2023-74", "vulns"]  # requests 2.25.1
    assert advisory["message"]["text"].startswith("requests 2.25.1: PYSEC-2023-74 (CVE-2023-32681")
    # where in the image it is; the location code scanning shows is a file of the repository
    # (the attempt's statement.json here: a built-in pipeline has no file)
    assert advisory["properties"]["imagePath"] == "/usr/local/lib/python3.11/dist-packages"
    location = advisory["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location["uriBaseId"] == "%SRCROOT%" and location["uri"].endswith("statement.json")
    rules = {rule["id"]: rule for rule in run["tool"]["driver"]["rules"]}
    assert "security" in rules["PYSEC-2023-74"]["properties"]["tags"]
    assert run["properties"]["verdict"] == "FAIL"
    # The stages that passed are not results.
    assert {stage for _, stage in results} == {"find_spec", "vulns"}
