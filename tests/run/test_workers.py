"""An interrupt that lands while a run's worker threads are starting cancels every one of them
and waits for each before going on: no run keeps making containers after the CLI said it was
interrupted (a thread started inside an interrupted Thread.start() used to be waited for by
nobody)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from imagegate._support import workers

pytestmark = pytest.mark.signals


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_while_threads_start_cancels_and_waits_for_every_call() -> None:
    cancel = threading.Event()
    lock = threading.Lock()
    running: set[int] = set()
    started: list[int] = []
    finished: list[int] = []

    def call(i: int) -> int:
        with lock:
            running.add(i)
            started.append(i)
        if i == 0:
            # The first thread interrupts the main thread while it is still starting the others.
            os.kill(os.getpid(), signal.SIGINT)
        cancel.wait(5.0)  # as a run watches its cancel event
        time.sleep(0.05)
        with lock:
            running.discard(i)
            finished.append(i)
        return i

    # A bystander thread that does not hold the signals: the kernel may hand SIGINT to it, and
    # Python still raises it in the main thread (as in the CLI, where progress threads run).
    stop = threading.Event()
    bystander = threading.Thread(target=stop.wait, daemon=True)
    bystander.start()
    for _ in range(5):
        cancel.clear()
        started.clear()
        finished.clear()
        with pytest.raises(KeyboardInterrupt):
            workers.run_all(call, list(range(24)), cancel, "test")
        assert cancel.is_set()
        assert running == set(), f"calls still running after the interrupt went on: {sorted(running)}"
        assert sorted(finished) == sorted(started)  # every call that began has ended
    stop.set()


def test_results_come_back_in_order() -> None:
    cancel = threading.Event()
    assert workers.run_all(lambda i: i * i, [3, 1, 2], cancel, "test") == [9, 1, 4]
    assert not cancel.is_set()


def test_an_error_in_a_call_is_raised_after_all_calls_finish() -> None:
    cancel = threading.Event()
    done: list[int] = []

    def call(i: int) -> int:
        if i == 1:
            raise ValueError("stage runner broke")
        time.sleep(0.2)
        done.append(i)
        return i

    with pytest.raises(ValueError, match="stage runner broke"):
        workers.run_all(call, [0, 1, 2], cancel, "test")
    assert sorted(done) == [0, 2]


@pytest.mark.usefixtures("sigint_raises")
def test_a_background_task_is_waited_for_when_an_interrupt_ends_the_block() -> None:
    finished: list[str] = []

    def outside() -> str:
        time.sleep(0.3)
        finished.append("outside")
        return "done"

    with pytest.raises(KeyboardInterrupt), workers.background(outside, "test") as task:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the interrupt lands here
        task.result()
    assert finished == ["outside"]
