"""The controller's real output for the `pod collect` tests: the bundle a Pod would run, run by
the real controller in a real image through the docker driver at test time, so the logs always
have the shapes the controller emits (never hand-written, never checked in)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from imagegate import runner
from imagegate.drivers.docker import DockerDriver

# What `kubectl logs` interleaves from the container's stderr: a line the image printed itself.
IMAGE_LINE = b"WARNING: the image printed this line itself; it is kept as evidence and ignored\n"


@dataclass(frozen=True)
class ControllerLog:
    prep: runner.Prepared  # the bundle that printed it: collect must be given the same one
    stdout: bytes

    def options(self, out: Path) -> runner.RunOptions:
        return runner.RunOptions(pipeline="python", modules=["json"], out=out)

    def with_image_line(self) -> bytes:
        first, _, rest = self.stdout.partition(b"\n")
        return first + b"\n" + IMAGE_LINE + rest

    def cut_after(self, stage_id: str) -> bytes:
        """What a Pod killed right after `stage_id` reported leaves: the real output up to the
        last line that names that stage (a real prefix, as a killed container's log is)."""
        lines = self.stdout.splitlines(keepends=True)
        last = max(i for i, line in enumerate(lines) if stage_id.encode() in line)
        return b"".join(lines[: last + 1])


def _run_controller(image_ref: str) -> ControllerLog:
    prep = runner.prepare(runner.RunOptions(pipeline="python", modules=["json"]))
    driver = DockerDriver()
    image = driver.resolve(image_ref)
    br = driver.run_bundle(
        image, prep.bundle.data, prep.bundle.sha256, prep.interpreters, prep.deadline(None)
    )
    assert br.exit_code == 0 and br.error is None, (br.error, br.stderr[-2000:])
    return ControllerLog(prep, br.stdout)


@pytest.fixture(scope="session")
def controller_logs(images: dict[str, str]) -> dict[str, ControllerLog]:
    """The python pipeline (-m json) on a clean image and on one with a real pip conflict."""
    return {"pass": _run_controller(images["python"]), "pip-conflict": _run_controller(images["conflict"])}
