"""The stop a signal (or the deadline's hard stop, or --fail-fast) sets for the worker threads:
each reader raises Stopped at its next chunk, a read blocked in a silent server is cut, and only
a stop that is not the command's is lifted. In-process and quick; the same at real sizes, through
the CLI: tests/run/test_interrupt_phases.py."""

from __future__ import annotations

import io
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator

import pytest

from imagegate._support import deadline, interrupts
from imagegate.errors import EngineError
from imagegate.oci.hashing import digest_blob
from imagegate.oci.readahead import ThreadedReader
from imagegate.oci.sources.daemon import EngineStream

SOON_S = 1.0  # a stopped reader ends within this (its polls are 0.2 s)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    interrupts._first, interrupts._raised, interrupts._hard_stopped = None, False, False
    interrupts._stop.clear()
    interrupts._cuts.clear()
    yield
    interrupts._first, interrupts._raised, interrupts._hard_stopped = None, False, False
    interrupts._stop.clear()
    interrupts._cuts.clear()


def _stop_in(seconds: float) -> None:
    threading.Timer(seconds, interrupts.stop).start()


def test_a_stop_is_raised_at_the_next_read_as_an_interrupt() -> None:
    interrupts.check_stop("x")  # nothing yet
    assert not interrupts.stopping()
    interrupts.stop()
    assert interrupts.stopping()
    with pytest.raises(KeyboardInterrupt) as e:  # nothing that catches Exception keeps it
        interrupts.check_stop("the blob")
    assert isinstance(e.value, interrupts.Stopped)
    assert "the blob" in str(e.value)


def test_hashing_an_endless_stream_stops_at_the_next_chunk() -> None:
    class Endless(io.RawIOBase):
        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            b[:] = bytes(len(b))
            return len(b)

    _stop_in(0.3)
    t0 = time.monotonic()
    with pytest.raises(interrupts.Stopped):
        digest_blob(Endless(), layer=False)
    assert time.monotonic() - t0 < 0.3 + SOON_S


@pytest.mark.parametrize("pipeline", [True, False])
def test_hashing_a_layer_stops_too(pipeline: bool) -> None:
    class Endless(io.RawIOBase):
        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            b[:] = b"a" * len(b)
            return len(b)

    _stop_in(0.3)
    with pytest.raises(interrupts.Stopped):
        digest_blob(Endless(), pipeline=pipeline)


class _Flowing(io.RawIOBase):
    """Zeros as fast as they are read, for `seconds`: a stream that never waits."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        if time.monotonic() > self.end:
            return 0
        b[:] = bytes(len(b))
        return len(b)


@pytest.mark.parametrize(("layer", "pipeline"), [(False, None), (True, True), (True, False)])
def test_the_commands_deadline_ends_the_hashing_of_a_stream_that_never_waits(
    layer: bool, pipeline: bool | None
) -> None:
    """A stream that flows never waits long enough for a reader's timeout to see the deadline:
    the hashing itself checks it (a 3 GiB export went on 14 s past a 24 s --timeout, to a PASS)."""
    deadline._current = deadline.Deadline(0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(deadline.DeadlineReached, match="waiting for the blob sha256:feed"):
            digest_blob(_Flowing(5.0), layer=layer, pipeline=pipeline, what="the blob sha256:feed")
    finally:
        deadline._current = None
    assert time.monotonic() - t0 < 0.3 + SOON_S


def test_an_engine_export_that_flows_ends_at_its_own_timeout() -> None:
    """The export's own timeout (the layers stage's) holds while chunks come, not only while the
    engine is silent."""

    def produce() -> Iterator[bytes]:
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            yield bytes(1 << 16)

    stream = EngineStream(produce, lambda e, n, s: RuntimeError(e), what="an export", timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="gave up after 0 s: the engine had not sent the whole export"):
        while stream.read(1 << 16):
            pass
    assert time.monotonic() - t0 < 0.3 + SOON_S
    stream.close()


def test_a_reader_waiting_for_a_silent_producer_stops() -> None:
    never = threading.Event()

    def produce() -> Iterator[bytes]:
        never.wait(30)  # an engine preparing an export, no byte yet
        yield b""

    reader = ThreadedReader(produce, depth=2, name="silent")
    _stop_in(0.3)
    t0 = time.monotonic()
    with pytest.raises(interrupts.Stopped):
        reader.read(10)
    assert time.monotonic() - t0 < 0.3 + SOON_S
    never.set()
    reader.close()


def test_a_producer_blocked_on_a_full_queue_stops() -> None:
    def produce() -> Iterator[bytes]:
        while True:
            yield b"x" * 100

    reader = ThreadedReader(produce, depth=1, name="full")
    time.sleep(0.1)  # the queue fills; nobody reads
    interrupts.stop()
    reader._thread.join(SOON_S)
    assert not reader._thread.is_alive()


def test_a_read_blocked_on_a_silent_socket_is_cut() -> None:
    a, b = socket.socketpair()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(a.recv(10)))
    t.start()
    done = interrupts.on_stop(lambda: interrupts.shutdown_socket(a))
    time.sleep(0.1)
    interrupts.stop()
    t.join(SOON_S)
    assert not t.is_alive() and got == [b""]
    done()
    a.close()
    b.close()


def test_a_cut_registered_after_the_stop_runs_at_once_and_an_unregistered_one_never() -> None:
    calls: list[str] = []
    done = interrupts.on_stop(lambda: calls.append("gone"))
    done()
    interrupts.stop()
    assert calls == []
    late = interrupts.on_stop(lambda: calls.append("late"))
    assert calls == ["late"]
    late()
    assert interrupts._cuts == {}


def test_a_failing_cut_does_not_keep_the_others_from_running() -> None:
    calls: list[str] = []

    def broken() -> None:
        raise OSError("already closed")

    interrupts.on_stop(broken)
    interrupts.on_stop(lambda: calls.append("ran"))
    interrupts.stop()
    assert calls == ["ran"] and interrupts.stopping()


def test_only_a_stop_that_is_not_the_commands_is_lifted() -> None:
    interrupts.stop()  # --fail-fast's
    assert not interrupts.signalled()
    interrupts.resume()
    assert not interrupts.stopping()
    interrupts.stop(final=True)  # the deadline's hard stop
    interrupts.resume()
    assert interrupts.stopping() and interrupts.signalled()


def test_the_first_signal_stops_the_workers_and_is_never_lifted() -> None:
    interrupts._held = 1  # inside a critical section: the interrupt itself waits, the stop does not
    try:
        interrupts._on_signal(signal.SIGTERM, None)
    finally:
        interrupts._held = 0
    assert interrupts.stopping() and interrupts.signalled()
    interrupts.resume()
    assert interrupts.stopping()


def test_the_deadlines_hard_stop_stops_the_workers_for_good() -> None:
    with deadline.covering(0.05) as d:
        deadline._armed += 1
        try:
            time.sleep(0.1)
            with pytest.raises(deadline.DeadlineReached):
                deadline._on_alarm(signal.SIGALRM, None)
        finally:
            deadline._armed -= 1
            deadline._stranded = False
        assert d.expired()
    assert interrupts.stopping() and interrupts.signalled()


def test_one_interrupt_is_raised_once_and_held_inside_a_critical_section() -> None:
    interrupts._held = 1
    try:
        interrupts._on_signal(signal.SIGINT, None)  # held: the section ends first
    finally:
        interrupts._held = 0
    interrupts._first = None
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_signal(signal.SIGINT, None)
    interrupts._on_signal(signal.SIGINT, None)  # a second Ctrl-C is only noted
    interrupts._on_signal(signal.SIGTERM, None)
    assert interrupts.exit_code() == interrupts.EXIT_SIGINT  # the first one's


def test_a_signal_inside_a_callback_whose_exceptions_are_dropped_is_delivered_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal while still importing can land in importlib's module-lock weakref callback, where a
    raised KeyboardInterrupt is printed and dropped: it is asked for again, and raised once out."""
    again: list[int] = []
    monkeypatch.setattr(interrupts._thread, "interrupt_main", again.append)
    namespace: dict[str, object] = {}
    exec(
        compile("import sys\ndef cb(): return sys._getframe()", "<frozen importlib._bootstrap>", "exec"),
        namespace,
    )
    inside = namespace["cb"]()  # type: ignore[operator]
    interrupts._on_signal(signal.SIGTERM, inside)
    assert again == [signal.SIGTERM] and interrupts.stopping()
    with pytest.raises(KeyboardInterrupt):  # once out of it, the same signal raises
        interrupts._on_signal(signal.SIGTERM, sys._getframe())
    assert interrupts.exit_code() == 143


def test_a_signal_in_a_finalizer_is_delivered_again(monkeypatch: pytest.MonkeyPatch) -> None:
    again: list[int] = []
    monkeypatch.setattr(interrupts._thread, "interrupt_main", again.append)

    class Held:
        def __del__(self) -> None:
            interrupts._on_signal(signal.SIGINT, sys._getframe())

    Held()
    assert again == [signal.SIGINT]


def _frame_of(name: str, filename: str) -> types.FrameType:
    namespace: dict[str, object] = {}
    exec(compile(f"import sys\ndef {name}(): return sys._getframe()", filename, "exec"), namespace)
    return namespace[name]()  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize(
    ("name", "filename"),
    [
        ("Run", "x.py"),
        ("cb", "x.py"),
        ("load", "<frozen importlib._bootstrap>"),
        ("_lock", "<frozen importlib._bootstrap>"),
    ],
)
def test_a_signal_anywhere_else_raises_at_once(
    name: str, filename: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only importlib's `cb` and a finalizer drop what they raise: a function of another name, or
    named `cb` elsewhere, gets the interrupt itself."""
    again: list[int] = []
    monkeypatch.setattr(interrupts._thread, "interrupt_main", again.append)
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_signal(signal.SIGINT, _frame_of(name, filename))
    assert again == []
