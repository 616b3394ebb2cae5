"""The command's one deadline (imagegate._support.deadline) on its own: the clock starts with the process,
each wait ends by the deadline, a passed deadline names what it waited for, and the hard stop
interrupts the main thread. tests/oci/test_deadline.py shows the same through real registries
and engines; these run in a second and are what scripts/mutation.py runs against the module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from imagegate._support import deadline
from imagegate._support.deadline import Deadline, DeadlineReached


def test_the_clock_starts_with_the_process() -> None:
    """A command whose imports took 1.5 s has 1.5 s less: its deadline counts from its exec."""
    code = (
        "import time; time.sleep(1.5)\n"
        "from imagegate._support import deadline\n"
        "print(time.monotonic() - deadline.process_start())\n"
        "with deadline.covering(10.0) as d: print(d.remaining())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    age, remaining = (float(x) for x in out.split())
    assert 1.5 <= age < 5.0
    assert 5.0 < remaining <= 10.0 - 1.5


def _stat_started(seconds_ago: float, name: bytes = b"python3") -> bytes:
    """This process's own /proc/self/stat line, its command name and start time (field 22)
    rewritten: as the line of a process `name` started `seconds_ago`."""
    raw = Path("/proc/self/stat").read_bytes()
    pid, tail = raw.split(b" ", 1)[0], raw[raw.rfind(b")") + 2 :]
    fields = tail.split()
    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    fields[19] = str(round((boot - seconds_ago) * os.sysconf("SC_CLK_TCK"))).encode()
    return pid + b" (" + name + b") " + b" ".join(fields)


def test_a_process_older_than_30_s_ran_before_the_command_and_counts_from_now() -> None:
    assert deadline.MAX_AGE_S == 30.0
    for age, counted in (
        (0.5, True),
        (29.5, True),
        (30.5, False),
        (3600.0, False),
        (-0.5, False),
        (-5.0, False),
    ):
        start = deadline.process_start(_stat_started(age))
        expected = time.monotonic() - (age if counted else 0.0)
        assert start == pytest.approx(expected, abs=0.1), (age, counted)
    # the command name may hold spaces and parentheses: the fields are counted after its last ")"
    plain = _stat_started(12.0)  # one line, its name changed: two reads of the clock may differ by a tick
    odd = plain.replace(b" (python3) ", b" (evil) 1 2 3 (name) ", 1)
    assert odd != plain and deadline.started(odd) == deadline.started(plain)
    assert deadline.process_start(odd) == pytest.approx(time.monotonic() - 12.0, abs=0.1)
    # unreadable: now
    assert deadline.process_start(b"garbage") == pytest.approx(time.monotonic(), abs=0.1)


def test_a_wait_ends_by_the_deadline() -> None:
    d = Deadline(2.0)
    assert d.cap(None) == pytest.approx(2.0, abs=0.2)  # no limit of its own: what is left
    assert d.cap(0.5) == 0.5  # a shorter wait keeps its own
    assert d.cap(60.0) == pytest.approx(2.0, abs=0.2)  # a longer one is cut to what is left
    assert not d.expired()
    gone = Deadline(1.0, start=time.monotonic() - 5.0)
    assert gone.expired() and gone.remaining() < -3.9
    assert gone.cap(10.0) == 0.05  # past the deadline: one short try, never a negative timeout
    assert gone.cap(None) == 0.05


def test_the_module_level_helpers_follow_the_current_deadline() -> None:
    assert deadline.current() is None
    assert deadline.cap(7.0) == 7.0 and deadline.cap(None) is None  # no deadline: the wait's own
    assert deadline.expired_error("x") is None
    deadline.check("anything")  # nothing to end
    with deadline.waiting("nothing"):
        pass
    with deadline.covering(60.0, "--timeout") as outer:
        assert deadline.current() is outer
        assert deadline.cap(None) == pytest.approx(outer.remaining(), abs=0.2)
        assert deadline.cap(1.0) == 1.0
        # an inner deadline starts now, not with the process
        with deadline.covering(0.0, "--inner") as inner:
            assert deadline.current() is inner and inner.expired()
            err = deadline.expired_error("the manifest")
            assert isinstance(err, DeadlineReached)
            assert "the 0 s deadline (--inner) passed while waiting for the manifest" in str(err)
            with pytest.raises(DeadlineReached, match="waiting for the token"):
                deadline.check("the token")
        assert deadline.current() is outer
        assert deadline.expired_error("x") is None
        deadline.check("still in time")
    assert deadline.current() is None


def test_a_nested_deadline_ends_by_the_outer_one_and_names_it() -> None:
    """An item of a batch with a longer timeout than what is left of the command's: the command's
    comes first, and its option is the one named."""
    with deadline.covering(0.0, "--timeout"), deadline.covering(600.0, "timeout of the entry") as inner:
        assert inner.expired() and inner.option == "--timeout"
    with deadline.covering(600.0, "--timeout"), deadline.covering(5.0, "timeout of the entry") as inner:
        assert inner.remaining() <= 5.0 and inner.option == "timeout of the entry"


def test_the_deadline_the_user_named_is_the_one_road_to_the_work() -> None:
    """--timeout reaches the in-image deadline only through the command's deadline: a part with
    its own time (the stages' timeouts added up) keeps it under a default deadline, and gets all
    of a deadline the user named; never more than the command has left."""
    assert deadline.budget(30.0) == 30.0  # no deadline: the part's own
    with deadline.covering(3600.0):  # a default (run without --timeout)
        assert deadline.budget(30.0) == 30.0
    with deadline.covering(3600.0, explicit=True):  # --timeout 3600, counted from the process's start
        spent = time.monotonic() - deadline.process_start()
        assert 3590.0 - spent < deadline.budget(30.0) <= 3600.0
    with deadline.covering(10.0, explicit=True):  # --timeout 10: less than the stages' time
        assert deadline.budget(30.0) <= 10.0
    with deadline.covering(10.0):
        assert deadline.budget(30.0) <= 10.0


def test_a_passed_deadline_names_what_every_thread_waited_for() -> None:
    d = Deadline(1.5, "--deadline")
    err = d.error()
    assert str(err).startswith("the 1.5 s deadline (--deadline) passed while waiting for the command's work")
    assert err.exit_code == 2
    assert "raise --deadline" in (err.hint or "")
    assert d.error("the blob").args[0].endswith("waiting for the blob")
    with d.waiting("the manifest"):
        assert d.waiting_for() == "the manifest"
        with d.waiting("its first layer"):  # the same thread, deeper: the newest wait
            assert d.waiting_for() == "its first layer"
        assert d.waiting_for() == "the manifest"  # and back to what it waited for before
        ready, release = threading.Event(), threading.Event()

        def other() -> None:
            with d.waiting("a second layer"):
                ready.set()
                release.wait(5)

        t = threading.Thread(target=other)
        t.start()
        ready.wait(5)
        assert d.waiting_for() == "the manifest (and 1 more)"
        assert "waiting for the manifest (and 1 more)" in str(d.error())
        release.set()
        t.join()
        assert d.waiting_for() == "the manifest"
    assert d.waiting_for() is None
    d2 = Deadline(1.0)
    with d2.waiting("the same"), d2.waiting("other"):
        pass
    assert d2.waiting_for() is None


def test_the_hard_stop_interrupts_the_main_thread_after_the_grace() -> None:
    assert not deadline.stranded()
    before = signal.getsignal(signal.SIGALRM)
    # inside an outer deadline, an inner one starts now (the outer counts from this process's start)
    with deadline.covering(600.0), deadline.covering(0.3, "--timeout"):
        start = time.monotonic()
        with (
            pytest.raises(DeadlineReached, match="waiting for a library's own read"),
            deadline.armed(),
            deadline.waiting("a library's own read"),
        ):
            assert signal.getsignal(signal.SIGALRM) is not before
            time.sleep(30)
        took = time.monotonic() - start
    # the soft way gets GRACE_S to name the wait first; the hard stop comes right after
    assert deadline.GRACE_S - 0.5 < took < deadline.GRACE_S + 1.5
    assert deadline.stranded()
    deadline._stranded = False  # this process goes on: the flag is the entry point's to read
    # disarmed once the block is left: the handler before it is back, no alarm left to fire
    assert signal.getsignal(signal.SIGALRM) is before and pending() == 0.0


def test_a_deadline_long_past_is_a_hard_stop_at_once() -> None:
    """Armed after the deadline and its grace have passed: the alarm comes at once (never a
    timer for a negative or a later time, which would not stop the wait)."""
    deadline._current = Deadline(1.0, start=time.monotonic() - 10.0)
    try:
        start = time.monotonic()
        with pytest.raises(DeadlineReached), deadline.armed():
            time.sleep(5)
        assert time.monotonic() - start < 0.5
    finally:
        deadline._current, deadline._stranded = None, False


def test_an_alarm_outside_an_armed_stretch_interrupts_nothing() -> None:
    with deadline.covering(0.0):
        deadline._on_alarm(signal.SIGALRM, None)  # a late alarm after the block: ignored
    deadline._on_alarm(signal.SIGALRM, None)  # and with no deadline at all
    assert not deadline.stranded()


def test_armed_does_nothing_without_a_deadline_or_outside_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGALRM)
    with deadline.armed():
        assert signal.getsignal(signal.SIGALRM) is before
    seen: list[object] = []
    with deadline.covering(30.0):

        def other() -> None:
            with deadline.armed():  # no handler can be set from here: nothing, not a crash
                seen.append(signal.getsignal(signal.SIGALRM))

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [before]
    # nested: the outer stretch stays armed when the inner one ends
    with deadline.covering(600.0), deadline.covering(30.0), deadline.armed():  # the inner starts now
        with deadline.armed():
            pass
        assert 30.0 < pending() <= 30.0 + deadline.GRACE_S
    assert pending() == 0.0 and signal.getsignal(signal.SIGALRM) is before


def pending() -> float:
    return signal.getitimer(signal.ITIMER_REAL)[0]


def test_run_timeout_reaches_the_stages_only_through_the_commands_deadline() -> None:
    from imagegate.usecases import accept, runner

    prep = runner.prepare(runner.RunOptions(pipeline="python"))
    own = sum(s.timeout for s in prep.inside.stages) + runner.STARTUP_SLACK_S
    assert prep.deadline() == own  # outside a command: the stages' own time
    with accept.within(prep, None):  # run with no --timeout
        assert prep.deadline() == own
    with accept.within(prep, 7200.0):  # run --timeout 7200: the stages may take all of it
        assert own < prep.deadline() <= 7200.0
    with accept.within(prep, 5.0):  # run --timeout 5
        assert prep.deadline() <= 5.0
