"""The interpreter fallback the container and rootfs drivers share (interface.first_usable): the
first interpreter that can start the bundle runs it, and when none can the run says, for each
one tried, why."""

from __future__ import annotations

import threading

from imagegate.drivers.interface import BundleRun, first_usable


def test_the_first_interpreter_that_starts_runs_and_every_one_tried_is_recorded() -> None:
    asked: list[str] = []

    def attempt(interpreter: str) -> BundleRun | str:
        asked.append(interpreter)
        return "not found in the image" if interpreter == "python3" else BundleRun(b"", b"", 0)

    run = first_usable(["python3", "python", "python2"], attempt, None)
    assert run.exit_code == 0 and run.tried == ["python3", "python"]
    assert asked == ["python3", "python"]  # the one after a usable interpreter is never tried


def test_no_interpreter_names_each_reason() -> None:
    absent = first_usable(["python3", "python"], lambda _i: "not found in the image", None)
    assert absent.exit_code is None and absent.tried == ["python3", "python"]
    assert absent.error == (
        "no python interpreter in the image (tried python3, python): "
        "python3: not found in the image; python: not found in the image"
    )
    old = first_usable(
        ["python3", "python"],
        lambda i: (
            "not found in the image"
            if i == "python3"
            else "Python 2.7.18; the probes need Python 3.8 or newer"
        ),
        None,
    )
    assert old.error is not None and old.error.startswith("no usable python interpreter in the image")
    assert old.error.endswith("python: Python 2.7.18; the probes need Python 3.8 or newer")


def test_a_cancelled_run_tries_no_further_interpreter() -> None:
    cancel = threading.Event()

    def attempt(interpreter: str) -> BundleRun | str:
        cancel.set()  # e.g. an interrupt while the first one was tried
        return "not found in the image"

    run = first_usable(["python3", "python"], attempt, cancel)
    assert run.tried == ["python3"] and run.exit_code is None
