"""`run --reuse`'s rules one by one, on statements and folders made here (the whole flow on a real
engine is tests/run/test_reuse.py): which attempts the index offers, what makes a verified
statement another run than this one, run.json and the evidence read again as listed."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from imagegate import __version__
from imagegate.attest import verify as verifying
from imagegate.attest.keys import generate
from imagegate.domain.evidence import Attempt
from imagegate.domain.results import EvidenceFile, ImageFacts
from imagegate.domain.statements import Acceptance
from imagegate.errors import UsageError
from imagegate.usecases import reuse_attempt as reuse
from imagegate.usecases import runner

CFG, MAN = "sha256:" + "c" * 64, "sha256:" + "d" * 64
FINISHED = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
IMAGE = ImageFacts("app:1", CFG, MAN, platform="linux/amd64")


@pytest.fixture(scope="module")
def prep() -> runner.Prepared:
    return runner.prepare(runner.RunOptions(pipeline="python"))


@pytest.fixture(scope="module")
def policy() -> reuse.ReusePolicy:
    return reuse.ReusePolicy(3600.0, generate().public)


def _acceptance(prep: runner.Prepared, **changes: Any) -> Acceptance:
    pred: dict[str, Any] = {
        "verdict": "CPU_PASS_GPU_CLI_DEFERRED",
        "plan": prep.plan.to_json(),
        "pipeline": prep.plan.pipeline.to_json(),
        "image": {
            "reference": "app:1",
            "configDigest": CFG,
            "manifestDigest": MAN,
            "platform": "linux/amd64",
        },
        "environment": {"driver": "docker"},
        "stages": [],
        "evidence": [],
        "bundleSha256": prep.bundle.sha256,
        "attempt": {"id": "20261206T120000.000Z-aaaaaa"},
        "startedOn": "2026-12-06T11:59:00.000Z",
        "finishedOn": "2026-12-06T12:00:00.000Z",
        "imagegate": {"version": __version__},
    }
    pred.update(changes)
    return Acceptance.from_json(pred)


def _differs(prep: runner.Prepared, policy: reuse.ReusePolicy, acc: Acceptance, **kw: Any) -> str | None:
    image, driver = kw.get("image", IMAGE), kw.get("driver", "docker")
    return reuse._differs(acc, image, prep, driver, policy, kw.get("now", FINISHED + dt.timedelta(minutes=5)))


def test_an_equal_run_differs_in_nothing(prep: runner.Prepared, policy: reuse.ReusePolicy) -> None:
    assert _differs(prep, policy, _acceptance(prep)) is None
    assert _differs(prep, policy, _acceptance(prep, verdict="FAIL")) is None  # a rejection is an answer too


def test_an_error_a_completion_or_a_reuse_is_never_reused(
    prep: runner.Prepared, policy: reuse.ReusePolicy
) -> None:
    assert _differs(prep, policy, _acceptance(prep, verdict="ERROR")) == (
        "its verdict is ERROR: the run could not decide, so it runs again"
    )
    for link in ("completes", "reuses"):
        acc = _acceptance(prep, **{link: {"attempt": "x"}})
        assert (
            _differs(prep, policy, acc)
            == "a completion or a reuse: the attempt that ran is looked at instead"
        )


@pytest.mark.parametrize("digest", ["sha256:" + "0" * 64, "sha256:" + "f" * 64])
def test_another_image_is_not_this_one(prep: runner.Prepared, policy: reuse.ReusePolicy, digest: str) -> None:
    for field in ("configDigest", "manifestDigest"):
        image = {"reference": "app:1", "configDigest": CFG, "manifestDigest": MAN, "platform": "linux/amd64"}
        image[field] = digest
        assert (_differs(prep, policy, _acceptance(prep, image=image)) or "").startswith("another image: ")


@pytest.mark.parametrize("low", [True, False], ids=["sorts-below", "sorts-above"])
def test_another_plan_bundle_version_or_driver(
    prep: runner.Prepared, policy: reuse.ReusePolicy, low: bool
) -> None:
    other = "0" if low else "~"  # below and above every name and digest in the ASCII order
    assert _differs(prep, policy, _acceptance(prep, plan={other: 1})) == "another plan"
    assert _differs(prep, policy, _acceptance(prep, bundleSha256=other)) == "another probes bundle"
    assert (
        _differs(prep, policy, _acceptance(prep, imagegate={"version": other})) == "another imagegate version"
    )
    assert _differs(prep, policy, _acceptance(prep), driver=other) == "another driver"


def test_an_age_up_to_the_bound_is_reused_and_past_it_not(
    prep: runner.Prepared, policy: reuse.ReusePolicy
) -> None:
    acc = _acceptance(prep)
    assert _differs(prep, policy, acc, now=FINISHED + dt.timedelta(hours=1)) is None  # exactly --reuse-within
    late = _differs(prep, policy, acc, now=FINISHED + dt.timedelta(hours=1000))  # hours to a tenth
    assert late == "finished 1000.0 h ago, past --reuse-within 1 h"
    skew = dt.timedelta(seconds=reuse.SKEW_S)
    assert _differs(prep, policy, acc, now=FINISHED - skew) is None  # a clock this far behind is believed
    ahead = _differs(prep, policy, acc, now=FINISHED - skew - dt.timedelta(seconds=1))
    assert ahead == "finished in the future (2026-12-06T12:00:00.000Z)"
    assert (
        _differs(prep, policy, _acceptance(prep, finishedOn="yesterday"))
        == "finishedOn 'yesterday' is no time"
    )


def _index(folder: Path, lines: list[object]) -> Path:
    index = folder / "index.jsonl"
    index.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return index


def _id(n: int) -> str:
    return f"20261206T12{n // 60:02d}{n % 60:02d}.000Z-{n:06x}"


def test_the_index_offers_each_attempt_once_newest_first_and_only_so_many(tmp_path: Path) -> None:
    assert reuse._candidates(tmp_path / "none.jsonl") == []
    lines: list[object] = [{"attempt": _id(n)} for n in range(40)]
    lines[5:5] = ["not json", "[1, 2]", {"attempt": 7}, {"attempt": "../../etc"}, {"attempt": _id(39)}]
    lines.insert(20, {"attempt": _id(100), "reuses": _id(3)})  # a reuse: its own attempt is offered instead
    got = reuse._candidates(_index(tmp_path, lines))
    assert got == [_id(n) for n in range(39, 39 - reuse.MAX_CANDIDATES, -1)]


def test_an_index_that_names_nothing_valid_offers_nothing(tmp_path: Path) -> None:
    assert reuse._candidates(_index(tmp_path, ["{", {"attempt": None}, {"attempt": "x"}])) == []
    short = _index(tmp_path, [{"attempt": _id(n)} for n in range(3)] + ["garbage"])
    assert reuse._candidates(short) == [_id(2), _id(1), _id(0)]


def test_run_json_is_the_listed_bytes_or_no_answer(tmp_path: Path, prep: runner.Prepared) -> None:
    data = b'{"inputs": {}}'
    (tmp_path / "run.json").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    earlier = verifying.SignedAttempt(tmp_path, {}, b"", "k")
    listed = [
        {"path": "plan.json", "sha256": "a" * 64, "size": 1},
        {"path": "stages/01-x/result.json", "sha256": "b" * 64, "size": 1},
        {"path": "run.json", "sha256": sha, "size": len(data)},
    ]
    assert reuse._run_json(earlier, _acceptance(prep, evidence=listed)) == data
    assert reuse._run_json(earlier, _acceptance(prep, evidence=listed[:2])) == "lists no run.json"
    for other in ("0" * 64, "f" * 64):
        changed = [*listed[:2], {"path": "run.json", "sha256": other, "size": len(data)}]
        assert (
            reuse._run_json(earlier, _acceptance(prep, evidence=changed))
            == "run.json changed after it verified"
        )
    (tmp_path / "run.json").unlink()
    assert (reuse._run_json(earlier, _acceptance(prep, evidence=listed)) or "").startswith(
        "run.json unreadable ("
    )


@pytest.mark.parametrize("extra, whole", [(0, True), (1, False)], ids=["16-MiB", "one-byte-more"])
def test_run_json_is_read_up_to_16_mib(
    tmp_path: Path, prep: runner.Prepared, extra: int, whole: bool
) -> None:
    data = b" " * ((16 << 20) + extra)
    (tmp_path / "run.json").write_bytes(data)
    listed = [{"path": "run.json", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}]
    got = reuse._run_json(verifying.SignedAttempt(tmp_path, {}, b"", "k"), _acceptance(prep, evidence=listed))
    assert (got == data) is whole and (whole or got == "run.json changed after it verified")


def test_inputs_are_read_from_run_json_or_none() -> None:
    assert reuse.inputs_of(b'{"inputs": {"source": null}}') == {"source": None}
    assert (
        reuse.inputs_of(b"[1]") is None
        and reuse.inputs_of(b"not json") is None
        and reuse.inputs_of(b"{}") is None
    )


def test_evidence_is_taken_as_listed_or_refused(tmp_path: Path) -> None:
    source = tmp_path / "earlier"
    (source / "stages/01-x").mkdir(parents=True)
    body = b"the stage's output\n"
    (source / "stages/01-x/stdout.txt").write_bytes(body)
    sha = hashlib.sha256(body).hexdigest()
    files = [EvidenceFile("plan.json", "a" * 64, 1), EvidenceFile("stages/01-x/stdout.txt", sha, len(body))]
    attempt = Attempt(tmp_path / "out", IMAGE)
    reuse._take_evidence(attempt, source, files)  # plan.json: the run writes its own
    assert (attempt.dir / "stages/01-x/stdout.txt").read_bytes() == body
    assert not (attempt.dir / "plan.json").exists()
    for listed in ("0" * 64, "f" * 64):
        again = Attempt(tmp_path / "out", IMAGE)
        with pytest.raises(UsageError) as e:
            reuse._take_evidence(again, source, [EvidenceFile("stages/01-x/stdout.txt", listed, len(body))])
        assert str(e.value) == (
            f"{source / 'stages/01-x/stdout.txt'}: changed after the attempt verified (sha256 {sha[:16]}…, "
            f"listed {listed[:16]}…): not reused"
        )


def test_a_folder_that_is_a_link_is_no_attempt(
    tmp_path: Path, prep: runner.Prepared, policy: reuse.ReusePolicy
) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    search = reuse.Search()
    for folder in (tmp_path / "link", tmp_path / "missing"):
        assert reuse._one(folder, IMAGE, prep, "docker", policy, FINISHED, search) == "no attempt folder"
    assert search.found is None
