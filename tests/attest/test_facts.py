"""The attestation carries every fact a probe reports: real probes in real images, each stage's
data compared key by key with the statement's facts; and the statement builder refuses a fact it
does not know instead of dropping it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest.statement import COMMON_EVIDENCE_ONLY, FACTS, stage_facts
from imagegate.errors import InternalError
from tests.helpers import imagegate

ROOT = Path(__file__).resolve().parents[2]
ADVISORY_DB = ROOT / "tests" / "vulns" / "data" / "advisory-db"

# Every probe, with what makes its data rich: pip problems (the conflict image), found, missing,
# namespace and failing modules, a CLI with a platform override and its raw run, a GPU-only
# stage run for the record, PyAV, the inventory and the audit, the layers.
EVERY_PROBE = """\
apiVersion: imagegate/v1
name: every-probe
stages:
  - id: pip_check
    probe: pip_check
  - id: find_spec
    probe: find_spec
    with: {modules: [json, email.mime, nosuchmodule, nosuchparent.child, av]}
  - id: cli
    probe: cli
    with:
      module: json.tool
      args: [--help]
      platform_code: "import os"
      record_raw: true
  - id: gpu_cli
    probe: cli
    requires: [gpu]
    with: {command: [python3, -c, "raise SystemExit(3)"]}
  - id: av_roundtrip
    probe: av_roundtrip
  - id: layers
    probe: layers
  - id: inventory
    probe: inventory
  - id: vulns
    probe: vulns
    needs: [inventory]
    with: {service: none}
"""


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _check_every_fact_is_carried(attempt: Path) -> set[str]:
    statement = json.loads((attempt / "statement.json").read_text())
    seen: set[str] = set()
    for st in statement["predicate"]["stages"]:
        folder = next(attempt.glob(f"stages/*-{st['id']}"), None)
        if folder is None or not (folder / "result.json").is_file():
            continue
        data: dict[str, Any] = json.loads((folder / "result.json").read_text())["data"]
        facts = st.get("facts", {})
        rules = FACTS[st["probe"]]
        evidence = {f["path"]: f["sha256"] for f in st["evidence"]}
        result_rel = (folder / "result.json").relative_to(attempt).as_posix()
        for key, value in data.items():
            seen.add(f"{st['probe']}.{key}")
            if key in rules.evidence_only or key in COMMON_EVIDENCE_ONLY:
                # left to the evidence on purpose: then the file that holds it is signed for
                assert evidence.get(result_rel) == _digest(folder / "result.json"), (st["id"], key)
            else:
                assert key in facts, f"stage {st['id']}: the attestation dropped {key!r} = {value!r}"
                assert facts[key] == value, (st["id"], key)
    return seen


@pytest.fixture(scope="module")
def attempts(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("facts")
    pipe = out / "every.yaml"
    pipe.write_text(EVERY_PROBE)
    # every-probe names missing modules (FAIL, exit 1); vllm-like under -p vllm is healthy, its
    # verdict decided by the advisories (exit 0 or 1 as its verdict says, never an ERROR)
    runs = [
        (images["conflict"], "-p", str(pipe)),
        (images["av"], "-p", str(pipe)),
        (images["vllm-like"], "-p", "vllm"),
    ]
    found = []
    for n, (image, *args) in enumerate(runs):
        r = imagegate(
            "run", image, *args, "--advisory-db", str(ADVISORY_DB), "-o", str(out / str(n)), "--no-sign",
            "--format", "json",
        )  # fmt: skip
        verdict = r.json()["predicate"]["verdict"]
        expected = {"FAIL": 1} if n < 2 else {"FAIL": 1, "CPU_PASS_GPU_CLI_DEFERRED": 0}
        assert expected.get(verdict) == r.returncode, (verdict, r.returncode, r.stderr)
        (attempt,) = [p.parent for p in (out / str(n)).glob("*/*/statement.json")]
        found.append(attempt)
    return found


def test_the_attestation_drops_no_fact_a_probe_reported(attempts: list[Path]) -> None:
    seen: set[str] = set()
    for attempt in attempts:
        seen |= _check_every_fact_is_carried(attempt)
    # the runs really exercised the rich shapes, so the comparison above means something
    for key in (
        "pip_check.problems",
        "find_spec.modules",
        "cli.raw",
        "cli.ran_for_record",
        "cli.version_choice",
        "av_roundtrip.decoded_frames",
        "inventory.distributions",
        "vulns.findings",
        "layers.verified",
    ):
        assert key in seen, sorted(seen)


def test_pip_project_and_find_spec_records_reach_the_statement(attempts: list[Path]) -> None:
    statement = json.loads((attempts[0] / "statement.json").read_text())
    st = {s["id"]: s for s in statement["predicate"]["stages"]}
    problems = st["pip_check"]["facts"]["problems"]
    assert {p["project"] for p in problems} == {"moviepy", "nixl"}
    mods = {m["module"]: m for m in st["find_spec"]["facts"]["modules"]}
    assert mods["json"]["found"] is True and mods["json"]["origin"].endswith("json/__init__.py")
    assert mods["nosuchparent.child"]["reason"] == "parent package nosuchparent is not installed"


def test_an_unknown_fact_is_refused_not_dropped() -> None:
    with pytest.raises(InternalError, match=r"stage s: probe find_spec reported the fact 'new_fact'"):
        stage_facts("s", "find_spec", {"modules": [], "new_fact": 1})


def test_an_unknown_key_of_a_record_is_refused() -> None:
    with pytest.raises(InternalError, match=r"problems with 'package'.*would be dropped"):
        stage_facts("s", "pip_check", {"problems": [{"kind": "conflict", "package": "x"}]})


def test_a_probe_without_rules_is_refused() -> None:
    with pytest.raises(InternalError, match=r"probe 'newprobe' reported facts \(x\)"):
        stage_facts("s", "newprobe", {"x": 1})
