"""The runner's side of the event channel (protocol.EventStream): only authenticated events, in
sequence and in plan order, are accepted; anything else that claims to be an event is named.
The byte streams here are made with the real encoder the controller mirrors; the end-to-end
tests with real hostile images are in tests/run/test_trust.py."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from imagegate.domain import protocol
from imagegate.domain.results import Status, verdict
from imagegate.usecases.runner.judging import INTEGRITY_STAGE, _distrust

KEY = bytes(range(32))
PLAN = ["pip_check", "find_spec"]
PROTECTED = {"isolated": True, "non_dumpable": True, "subreaper": True, "error": None}


def ev(kind: str, **kw: Any) -> dict[str, Any]:
    return {"event": kind, **kw}


def healthy() -> list[dict[str, Any]]:
    return [
        ev("start", protection=PROTECTED),
        ev("stage", id="pip_check", status="FAIL"),
        ev("stage", id="find_spec", status="PASS"),
        ev("end", stages=2),
    ]


def stream(events: list[dict[str, Any]], key: bytes = KEY, first_seq: int = 0) -> bytes:
    return b"".join(protocol.encode(key, n, e) for n, e in enumerate(events, first_seq))


def read(data: bytes, chunk: int | None = None) -> protocol.Events:
    s = protocol.EventStream(KEY, PLAN)
    step = chunk or max(1, len(data))
    for i in range(0, len(data), step):
        s.feed(data[i : i + step])
    return s.close()


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, None])
def test_healthy_stream_in_any_chunking(chunk: int | None) -> None:
    noise = b'image noise\n{"imagegate": 1, "event": "stage"}\nimagegate-eve'  # last one unterminated
    data = noise + stream(healthy())
    e = read(data, chunk)
    assert e.start is not None and e.end is not None and not e.violations
    assert {k: v["status"] for k, v in e.stages.items()} == {"pip_check": "FAIL", "find_spec": "PASS"}
    assert e.noise_bytes > 0 and b"image noise" in e.noise_head


def test_forged_line_is_rejected_and_named() -> None:
    forged = stream([ev("stage", id="pip_check", status="PASS")], key=bytes(32), first_seq=1)
    good = stream(healthy())
    start, rest = good.split(b"\n", 2)[1], good.split(b"\n", 2)[2]
    e = read(b"\n" + start + forged + b"\n" + rest)
    assert e.stages["pip_check"]["status"] == "FAIL"  # the real one, not the forgery
    assert e.violations_total == 1 and "fails authentication" in e.violations[0]


def test_replayed_event_is_rejected() -> None:
    lines = [protocol.encode(KEY, n, x) for n, x in enumerate(healthy())]
    e = read(lines[0] + lines[1] + lines[1] + lines[2] + lines[3])
    assert "event number 1 where 2 was expected" in e.violations[0]


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ([ev("start"), ev("stage", id="nope", status="PASS")], "not in the plan"),
        ([ev("start"), ev("stage", id="find_spec", status="PASS")], "out of plan order"),
        ([ev("start"), ev("stage", id="pip_check", status="FAIL"), ev("stage", id="pip_check", status="PASS")],
         "a second event for stage 'pip_check'"),
        ([ev("stage", id="pip_check", status="PASS")], "before the start event"),
        ([ev("start"), ev("end"), ev("stage", id="pip_check", status="PASS")], "after the end event"),
        ([ev("start"), ev("start")], "a second start event"),
        ([ev("start"), ev("surprise")], "unknown kind"),
    ],
)  # fmt: skip
def test_authenticated_but_impossible_sequences_are_named(events: list[dict[str, Any]], named: str) -> None:
    e = read(stream(events))
    assert any(named in v for v in e.violations), e.violations


def test_an_overlong_event_line_is_dropped_with_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "MAX_EVENT_LINE", 1 << 20)
    s = protocol.EventStream(KEY, PLAN)
    tracemalloc.start()
    s.feed(b"imagegate-event 2 0 " + b"x" * 1024)
    for _ in range(64):  # 64 MiB of one unterminated "event" line
        s.feed(b"y" * (1 << 20))
    s.feed(b"\n" + stream(healthy()))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    e = s.close()
    assert peak < 4 << 20, peak
    assert "longer than" in e.violations[0] and e.end is not None


def test_noise_is_counted_not_kept() -> None:
    s = protocol.EventStream(KEY, PLAN)
    tracemalloc.start()
    for _ in range(100):  # 100 MiB of short lines
        s.feed(b"noise line\n" * ((1 << 20) // 11))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    s.feed(stream(healthy()))
    e = s.close()
    assert peak < 4 << 20 and len(e.noise_head) == protocol.NOISE_KEEP and not e.violations


def test_violations_or_an_unprotected_controller_make_the_run_error() -> None:
    e = read(stream(healthy()))
    assert _distrust(e) is None
    e.violations_total, e.violations = 1, ["line 3: an event line that fails authentication (forged?): …"]
    assert "fails authentication" in (_distrust(e) or "")
    unprotected = read(
        stream([ev("start", protection={**PROTECTED, "non_dumpable": False, "error": "no ctypes"})])
    )
    why = _distrust(unprotected) or ""
    assert "not non-dumpable" in why and "no ctypes" in why
    # The integrity stage is an ERROR: with every real stage passing, the verdict is ERROR.
    from imagegate.domain.results import StageResult

    stages = [StageResult(INTEGRITY_STAGE, "controller", "inside", Status.ERROR, why)]
    stages.append(StageResult("find_spec", "find_spec", "inside", Status.PASS, ""))
    assert verdict(stages) == "ERROR"


def test_a_stage_start_is_accepted_only_for_the_next_stage() -> None:
    events = [ev("start"), ev("stage_start", id="pip_check"), ev("stage", id="pip_check", status="PASS")]
    events.append(ev("stage_start", id="find_spec"))  # then the run is cut
    e = read(stream(events))
    assert set(e.started) == {"pip_check", "find_spec"} and not e.violations
    assert e.closed_at is not None and e.closed_at >= e.started["find_spec"]
    wrong = read(stream([ev("start"), ev("stage_start", id="find_spec")]))
    assert "a start for stage 'find_spec' where 'pip_check' was next" in wrong.violations[0]
