"""The vulns stage and how --advisory-db puts it into a plan, without an engine."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path
from typing import Any

import pytest

from imagegate import pipeline
from imagegate.domain.plan import build_plan
from imagegate.domain.results import ImageFacts, StageResult, Status
from imagegate.errors import UsageError
from imagegate.pipeline.params import VulnsParams
from imagegate.stages import OutsideContext
from imagegate.stages.vulns import run_vulns_stage
from imagegate.usecases import accept

INVENTORY = {
    "distributions": [
        {"name": "Pillow", "version": "9.5.0", "location": "/usr/local/lib/python3.11/dist-packages"},
        {"name": "pip", "version": "23.0.1", "location": "/usr/lib/python3/dist-packages"},
        {"name": "pip", "version": "23.0.1", "location": "/usr/lib/python3/dist-packages"},
    ]
}


def ctx(
    tmp_path: Path, options: dict[str, Any] | None = None, inv: StageResult | None = None
) -> OutsideContext:
    inv = inv or StageResult(
        "inventory", "inventory", "inside", Status.PASS, "2 distributions", data=INVENTORY
    )
    return OutsideContext(
        image=ImageFacts("x", None),
        driver="docker",
        stage_dir=tmp_path,
        inside_results={inv.id: inv},
        advisory_db=(options or {}).get("advisory_db"),
    )


def test_offline_fail_names_ids_and_writes_findings(tmp_path: Path, advisory_db: Path) -> None:
    out = run_vulns_stage(ctx(tmp_path, {"advisory_db": advisory_db}), VulnsParams())
    assert out.status is Status.FAIL
    assert "PYSEC-2023-227" in out.detail and "PYSEC-2023-228 (CVE-2023-5752)" in out.detail
    f = next(f for f in out.data["findings"] if f["id"] == "PYSEC-2023-228")
    assert f == f | {"package": "pip", "version": "23.0.1", "fixed": ["23.3"], "state": "counted"}
    assert f["locations"] == ["/usr/lib/python3/dist-packages"]
    assert (tmp_path / "findings.json").is_file()


def test_ignored_until_expiry_then_fails(tmp_path: Path, advisory_db: Path) -> None:
    ignores = [
        {"id": i, "reason": "not reachable in this service", "expires": "2026-12-31"}
        for i in ("PYSEC-2023-175", "CVE-2023-44271", "PYSEC-2023-228")
    ]
    params = VulnsParams.model_validate({"ignore": ignores})
    c = ctx(tmp_path, {"advisory_db": advisory_db})
    out = run_vulns_stage(c, params, today=dt.date(2026, 12, 31))
    assert out.status is Status.PASS, out.detail
    assert {f["state"] for f in out.data["findings"]} == {"ignored"}
    (tmp_path / "findings.json").unlink()
    out = run_vulns_stage(c, params, today=dt.date(2027, 1, 1))
    assert out.status is Status.FAIL and "expired on 2026-12-31" in out.detail


def test_no_database_and_no_service_is_deferred_never_pass(tmp_path: Path) -> None:
    out = run_vulns_stage(ctx(tmp_path), VulnsParams(service="none"))
    assert out.status is Status.DEFERRED and "--advisory-db" in out.detail


def test_unreachable_service_is_deferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real service, made unreachable the way a CI network does it: every request goes through
    # a proxy that is not there (a port on 127.0.0.1 that nothing listens on).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    out = run_vulns_stage(ctx(tmp_path), VulnsParams())
    assert out.status is Status.DEFERRED, out.detail
    # refused by the dead proxy: the request really went out, through the proxy the environment names
    assert out.detail.startswith("osv vulnerability service unreachable: connection refused;"), out.detail


def test_bad_database_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_vulns_stage(ctx(tmp_path, {"advisory_db": empty}), VulnsParams())
    assert out.status is Status.ERROR and "no PyPI advisories" in out.detail


def test_without_inventory_it_is_an_error(tmp_path: Path) -> None:
    failed = StageResult("inventory", "inventory", "inside", Status.ERROR, "crashed")
    assert run_vulns_stage(ctx(tmp_path, inv=failed), VulnsParams()).status is Status.ERROR


# Plans.


def test_python_pipeline_has_no_audit_without_a_database() -> None:
    plan = build_plan(pipeline.load("python"))
    assert {s.probe for s in plan.stages} == {"pip_check", "find_spec"}


def test_advisory_db_adds_inventory_and_vulns(advisory_db: Path) -> None:
    plan = build_plan(pipeline.load("python"), advisory_db=advisory_db)
    inv, vulns = plan.stages[-2:]
    assert (inv.id, inv.side, vulns.id, vulns.side) == ("inventory", "inside", "vulns", "outside")
    assert vulns.needs == ("inventory",)
    # A stage the pipeline file does not have still carries validated params.
    assert isinstance(vulns.params, VulnsParams)


def test_missing_database_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such folder"):
        build_plan(pipeline.load("python"), advisory_db=tmp_path / "nope")


PIPE = """apiVersion: imagegate/v1
kind: Pipeline
name: audited
stages:
{stages}
"""


def test_pipeline_with_vulns_needs_an_inventory_stage(tmp_path: Path) -> None:
    only = tmp_path / "p.yaml"
    only.write_text(PIPE.format(stages="  - id: vulns\n    probe: vulns\n"))
    with pytest.raises(UsageError, match="no inventory stage"):
        build_plan(pipeline.load(str(only)))


def test_pipeline_own_vulns_stage_is_kept(tmp_path: Path, advisory_db: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        PIPE.format(
            stages="  - id: inv\n    probe: inventory\n  - id: audit\n    probe: vulns\n    needs: [inv]\n"
            "    with:\n      fail_on: high\n      service: none\n"
        )
    )
    plan = build_plan(pipeline.load(str(p)), advisory_db=advisory_db)
    assert plan.ids == ["inv", "audit"]
    assert isinstance(plan.stages[1].params, VulnsParams) and plan.stages[1].params.fail_on == "high"


def test_ignore_without_expiry_is_rejected_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        PIPE.format(
            stages="  - id: inv\n    probe: inventory\n  - id: audit\n    probe: vulns\n    with:\n"
            "      ignore:\n        - id: PYSEC-2023-228\n          reason: later\n"
        )
    )
    with pytest.raises(UsageError, match=r"p.yaml:1\d: stages\[1\]\.with\.ignore\[0\]\.expires"):
        pipeline.load(str(p))


def test_an_outside_stage_honours_requires(tmp_path: Path, advisory_db: Path) -> None:
    """`requires: [gpu]` on an outside stage, on a host without one: it runs for the record and is
    DEFERRED, as an in-image stage would be, never PASS or FAIL of the image."""
    import sys

    from imagegate.drivers.local import LocalDriver
    from imagegate.usecases import runner

    p = tmp_path / "p.yaml"
    p.write_text(
        PIPE.format(
            stages="  - id: inv\n    probe: inventory\n  - id: audit\n    probe: vulns\n    needs: [inv]\n"
            "    requires: [gpu]\n"
        )
    )
    opts = runner.RunOptions(pipeline=str(p), out=tmp_path / "out", advisory_db=advisory_db)
    observer = runner.DriverObserver(LocalDriver(sys.executable), "local", opts)
    record = accept.accept(accept.Request(runner.prepare(opts), observer, opts.out)).record
    audit = next(s for s in record.stages if s.id == "audit")
    assert audit.status is Status.DEFERRED, audit.detail
    assert audit.detail.startswith("requires gpu, not present here; ran for the record: ")
    assert audit.data["ran_for_record"]["status"] in ("PASS", "FAIL")
    assert record.verdict == "CPU_PASS_AUDIT_DEFERRED"


def test_the_advisory_folders_date_is_a_fact_a_freshness_rule_reads(
    tmp_path: Path, advisory_db: Path
) -> None:
    """The newest `modified` of the folder's advisories, UTC to the second: how old the audit's
    knowledge is, carried into the signed statement's facts."""
    from imagegate.attest.statement import stage_facts

    out = run_vulns_stage(ctx(tmp_path, {"advisory_db": advisory_db}), VulnsParams())
    newest = max(
        dt.datetime.fromisoformat(line.split("modified:")[1].strip().strip("'\"").replace("Z", "+00:00"))
        for p in advisory_db.rglob("*.yaml")
        for line in p.read_text().splitlines()
        if line.startswith("modified:")
    )
    assert out.data["advisories_as_of"] == newest.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert stage_facts("vulns", "vulns", out.data)["advisories_as_of"] == out.data["advisories_as_of"]
