"""The runner's phases as a use case drives them (usecases/runner): prepare, observe, judge,
then conclude, which computes the verdict, the record and the statement and writes nothing; the
attempt writes them in one step (Attempt.write_conclusion), and what it wrote is what the
statement lists and what `verify` accepts. Run --here (the local driver): no engine needed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from imagegate.attest import keys, sign, verify
from imagegate.domain.evidence import Attempt
from imagegate.drivers.local import LocalDriver
from imagegate.usecases import runner


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_conclude_writes_nothing_and_the_attempt_writes_what_the_statement_lists(tmp_path: Path) -> None:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path / "out")
    prep = runner.prepare(opts)
    observer = runner.DriverObserver(LocalDriver(None), None, opts)
    attempt = Attempt.begin(opts.out, observer.subject(prep), prep.evidence())
    obs = observer.observe(prep, attempt)
    judged = runner.judge(prep, obs, attempt)
    assert [r.status.value for r in judged.results] == ["PASS", "PASS"]
    before, index_before = _files(attempt.dir), _files(attempt.image_dir)
    done = runner.conclude(prep, obs, judged, attempt, runner.now())
    assert _files(attempt.dir) == before and _files(attempt.image_dir) == index_before  # nothing written
    assert done.record.verdict == "PASS"
    listed = {e.path: e.sha256 for e in done.statement.predicate.evidence}
    assert "run.json" not in before and listed["run.json"] == hashlib.sha256(done.run_json).hexdigest()
    attempt.write_conclusion(done.run_json, done.statement.to_json(), done.index_entry)
    assert json.loads((attempt.dir / "statement.json").read_text()) == done.statement.to_json()
    index = [json.loads(line) for line in (attempt.image_dir / "index.jsonl").read_text().splitlines()]
    assert index == [done.index_entry] and index[0]["attempt"] == attempt.id
    key = keys.generate()
    signed = sign.sign_attempt(attempt.dir, done.statement, key)
    report = verify.verify_file(signed.dsse_path, key.public, expect_verdict="PASS")
    assert report.ok, report.failures
