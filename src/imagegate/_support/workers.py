"""Worker threads that an interrupt can cancel but never orphan.

Python raises KeyboardInterrupt (and, through the CLI's handler, SIGTERM) in the main thread at
any bytecode, including inside `Thread.start()` while it waits for the new thread to run. A
ThreadPoolExecutor records a worker only after `start()` returns, so an interrupt landing there
leaves a running thread that nobody waits for: a run that goes on making and running containers
after the CLI has said it was interrupted. Holding the signals in the main thread is not enough
either: the kernel then hands them to any other thread, and Python still raises them in the main
thread. So the threads here carry a name unique to the call, and on the way out every thread of
that name that exists (started, or inside an interrupted start) is waited for."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from imagegate._support import deadline, interrupts

T = TypeVar("T")
R = TypeVar("R")


def _wait_for(tag: str) -> None:
    """Every thread named `tag-*` has ended (a second interrupt is only noted: interrupts.py), or,
    once the deadline's hard stop struck, GRACE_S more passed: a thread blocked on a server that never
    answers is left to the entry point, which exits without it (cli.main)."""
    me = threading.current_thread()
    give_up = time.monotonic() + deadline.GRACE_S
    while left := [t for t in threading.enumerate() if t.name.startswith(tag + "-") and t is not me]:
        if deadline.stranded() and time.monotonic() > give_up:
            return
        for t in left:
            try:
                t.join(0.1)
            except RuntimeError:  # inside an interrupted start(): not joinable yet, but it will run
                time.sleep(0.01)


def run_all(fn: Callable[[T], R], items: Sequence[T], cancel: threading.Event, name: str) -> list[R]:
    """`fn` over `items`, one thread each, all at once; the results in order (the first error,
    in order, is raised once all calls ended). On an exception in the calling thread (an
    interrupt), `cancel` is set and every call is waited for before the exception goes on: each
    call must watch `cancel` and clean up after itself."""
    tag = f"{name}-{secrets.token_hex(4)}"
    results: dict[int, R] = {}
    errors: list[BaseException | None] = [None] * len(items)

    def call(i: int, item: T) -> None:
        try:
            results[i] = fn(item)
        except BaseException as e:  # handed to the caller's thread
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i, x), name=f"{tag}-{i}") for i, x in enumerate(items)]
    try:
        # An interrupt is held while the threads start: one raised inside Thread.start() (its
        # Condition wait) can leave that lock released twice, a RuntimeError instead of the
        # interrupt; held, it is raised once every thread runs, and each is waited for below.
        with interrupts.critical():
            for t in threads:
                t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except BaseException:
        cancel.set()
        _wait_for(tag)
        raise
    for e in errors:
        if e is not None:
            raise e
    return [results[i] for i in range(len(items))]


class Background(Generic[R]):
    """`fn()` in a thread of its own; `result()` waits for it and returns (or raises) its outcome."""

    def __init__(self, fn: Callable[[], R]) -> None:
        self.fn = fn
        self.value: R | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as e:  # handed to the caller's thread
            self.error = e

    def result(self) -> R:
        assert self.thread is not None
        while self.thread.is_alive():
            self.thread.join(0.5)
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set when fn returned


@contextlib.contextmanager
def background(fn: Callable[[], R], name: str) -> Iterator[Background[R]]:
    """`fn()` runs in its own thread while the block runs; the thread is waited for on the way
    out, also when an interrupt ends the block: the interrupt stopped its reads
    (interrupts.stop), so it ends within a chunk's time."""
    tag = f"{name}-{secrets.token_hex(4)}"
    task = Background(fn)
    task.thread = threading.Thread(target=task._run, name=f"{tag}-0")
    try:
        with interrupts.critical():  # as in run_all: never raised inside Thread.start()
            task.thread.start()
        yield task
    finally:
        _wait_for(tag)
