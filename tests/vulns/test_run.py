"""Must-show, through the CLI on real images: the audit fails a known-vulnerable image naming the
advisories, passes a current one, honours an ignore until its expiry date, and defers (never
passes) when it has nothing to audit against."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.vulns.conftest import imagegate

pytestmark = pytest.mark.engine


def statement(r: object) -> dict:  # type: ignore[type-arg]
    return json.loads(r.stdout)  # type: ignore[attr-defined,no-any-return]


def stage(stmt: dict, sid: str) -> dict:  # type: ignore[type-arg]
    return next(s for s in stmt["predicate"]["stages"] if s["id"] == sid)  # type: ignore[no-any-return]


def findings(stmt: dict, attempt: Path) -> dict:  # type: ignore[type-arg]
    ev = next(e for e in stage(stmt, "vulns")["evidence"] if e["path"].endswith("/findings.json"))
    return json.loads((attempt / ev["path"]).read_text())  # type: ignore[no-any-return]


def attempt_dir(out: Path) -> Path:
    (d,) = [p for p in out.glob("*/*") if p.is_dir()]
    return d


def test_vulnerable_image_fails_naming_advisories(
    vuln_images: dict[str, str], advisory_db: Path, tmp_path: Path
) -> None:
    r = imagegate(
        "run",
        vuln_images["vulnerable"],
        "-p",
        "python",
        "--advisory-db",
        str(advisory_db),
        "-o",
        str(tmp_path),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    for vid in ("PYSEC-2023-227", "PYSEC-2023-175", "PYSEC-2023-74", "PYSEC-2023-228"):
        assert vid in r.stdout
    assert "verdict: FAIL" in r.stdout and "VULNS_FAIL" in r.stdout
    # The statement carries the stage and the sha256 of its findings; the findings name id,
    # aliases, package, version and fixed versions.
    r = imagegate(
        "run",
        vuln_images["vulnerable"],
        "--advisory-db",
        str(advisory_db),
        "-o",
        str(tmp_path / "j"),
        "--format",
        "json",
    )
    stmt = statement(r)
    assert stage(stmt, "vulns")["status"] == "FAIL" and stage(stmt, "inventory")["status"] == "PASS"
    data = findings(stmt, attempt_dir(tmp_path / "j"))
    req = next(f for f in data["findings"] if f["id"] == "PYSEC-2023-74")
    assert req["aliases"] == ["CVE-2023-32681", "GHSA-j8r2-6x86-q33q"]
    assert (req["package"], req["version"], req["fixed"]) == ("requests", "2.25.1", ["2.31.0"])
    assert req["locations"] == ["/usr/local/lib/python3.11/dist-packages"]


def test_current_releases_pass(vuln_images: dict[str, str], advisory_db: Path, tmp_path: Path) -> None:
    r = imagegate(
        "run",
        vuln_images["clean-current"],
        "-p",
        "python",
        "--advisory-db",
        str(advisory_db),
        "-o",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VULNS_PASS" in r.stdout and "verdict: PASS" in r.stdout


def test_without_a_database_the_python_pipeline_is_unchanged(
    vuln_images: dict[str, str], tmp_path: Path
) -> None:
    r = imagegate("run", vuln_images["clean-current"], "-p", "python", "-o", str(tmp_path))
    assert r.returncode == 0 and "verdict: PASS" in r.stdout and "VULNS" not in r.stdout


PIPELINE = """apiVersion: imagegate/v1
kind: Pipeline
name: python-audited
stages:
  - id: inventory
    probe: inventory
  - id: vulns
    probe: vulns
    needs: [inventory]
    with:
      service: none
      ignore:
        - id: CVE-2023-5752
          reason: pip is only used at build time in this image
          expires: {expires}
"""


@pytest.mark.parametrize(("days", "code", "verdict"), [(30, 0, "PASS"), (-1, 1, "FAIL")])
def test_ignore_with_reason_until_expiry(
    vuln_images: dict[str, str], advisory_db: Path, tmp_path: Path, days: int, code: int, verdict: str
) -> None:
    # The Debian base image: its pip 23.0.1 has exactly one advisory, PYSEC-2023-228 (CVE-2023-5752).
    expires = dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=days)
    pipe = tmp_path / "audited.yaml"
    pipe.write_text(PIPELINE.format(expires=expires.isoformat()))
    r = imagegate(
        "run", vuln_images["python"], "-p", str(pipe), "--advisory-db", str(advisory_db), "-o", str(tmp_path)
    )
    assert r.returncode == code, r.stdout + r.stderr
    assert f"verdict: {verdict}" in r.stdout
    if verdict == "FAIL":
        assert f"ignore of CVE-2023-5752 expired on {expires.isoformat()}" in r.stdout
        assert "PYSEC-2023-228" in r.stdout


def test_nothing_to_audit_against_is_deferred(vuln_images: dict[str, str], tmp_path: Path) -> None:
    pipe = tmp_path / "audited.yaml"
    pipe.write_text(PIPELINE.format(expires="2099-01-01"))
    r = imagegate("run", vuln_images["vulnerable"], "-p", str(pipe), "-o", str(tmp_path))
    # The audit, a check that needs no GPU, did not run: no level reached, so not accepted.
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: CPU_PASS_VULNS_DEFERRED" in r.stdout and "VULNS_DEFERRED" in r.stdout
    assert "rejected: no level reached (not run or not passed: vulns DEFERRED)" in " ".join(r.stdout.split())
    r = imagegate(
        "run", vuln_images["vulnerable"], "-p", str(pipe), "-o", str(tmp_path), "--require-complete"
    )
    assert r.returncode == 1
