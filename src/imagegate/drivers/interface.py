"""Where a bundle runs. A driver resolves the image once, runs the bundle with the image's own
interpreter under a deadline, and returns the raw output; it never interprets events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from imagegate._support.jsontypes import JsonObject
from imagegate.domain.gpus import Grant
from imagegate.domain.results import ImageFacts, Status

if TYPE_CHECKING:  # the verification's modules load when an image is verified, not with the driver
    from imagegate.oci.layercheck import VerifyReport
    from imagegate.oci.sources.interface import Source

# The controller's stdout is streamed to the runner's event reader (protocol.EventStream) as it
# arrives; a driver keeps only its head, for diagnostics. Memory stays bounded whatever an image
# writes.
STDOUT_CAP = 1024 * 1024
STDERR_CAP = 1024 * 1024


@dataclass
class BundleRun:
    stdout: bytes
    stderr: bytes
    exit_code: int | None  # None: killed or never started
    timed_out: bool = False
    interpreter: str | None = None  # the one that started
    tried: list[str] = field(default_factory=list)
    error: str | None = None  # why nothing (or not everything) ran, in words
    stdout_total: int = 0
    stderr_total: int = 0
    facts: JsonObject = field(default_factory=dict)  # e.g. container id, limits
    gpus: Grant | None = None  # GPUs the driver gave this run and saw (None: none given)


@dataclass(frozen=True)
class Refusal:
    """An image refused before it could run (the rootfs driver: a layer, the config or an entry
    failed verification while it was unpacked): a signed outcome like any other, never a bare
    error. `facts`: what was found (the layer, expected and actual digests, the entry, the
    source); `report`: the verification so far, for the evidence and the layers stage."""

    status: Status  # FAIL: the image was refused; ERROR: its source could not be read to the end
    detail: str
    facts: JsonObject
    report: VerifyReport | None = None
    stage: str = "unpack"  # the id of the stage that reports it: where the image was refused


@dataclass(frozen=True)
class Checked:
    """What a driver checked of an image before running it: the layer verification it made of
    the very bytes it runs (rootfs: while unpacking them; the layers stage reports it instead of
    reading them again), and the refusal, when the image was refused before anything could run
    in it (then run_bundle is never called). None: none."""

    verified: VerifyReport | None = None
    refusal: Refusal | None = None


def verification_facts(report: VerifyReport, layer: int | None) -> JsonObject:
    """What a refusal's evidence says of the verification: the source, the manifest read, the
    config (expected, actual, --expect-config), the layer refused (its expected and actual
    digests, sizes and diffIDs), the structural problems, how many layers were read."""
    import json
    from dataclasses import asdict

    config = report.config
    found = next((x for x in report.layers if x.index == layer), None)
    plain_layer = json.loads(json.dumps(asdict(found), default=str)) if found else {"index": layer}
    return {
        "source": report.source,
        "manifest_digest": report.manifest_digest,
        "config": {
            "status": config.status.value,
            "expected_digest": config.expected_digest,
            "actual_digest": config.actual_digest,
            "expected_size": config.expected_size,
            "actual_size": config.actual_size,
            "official_digest": config.official_digest,
            "detail": config.detail,
        },
        "layer": None if layer is None else plain_layer,
        "problems": list(report.problems),
        "layers_read": len(report.layers),
    }


@dataclass(frozen=True)
class BundleRequest:
    """One controller's run, as every driver is asked it (runner.run_inside makes it)."""

    image: ImageFacts
    bundle: bytes
    bundle_sha256: str
    interpreters: list[str]  # tried in order until one can run the bundle
    deadline_s: float
    event_key: bytes  # handed to the controller through a channel no stage can read
    on_stdout: OnOutput | None = None  # sees the controller's stdout as it arrives
    stages: Sequence[str] | None = None  # only these, in plan order (None: all of them)
    cancel: threading.Event | None = None  # set: stop early, removing everything


class Driver(Protocol):
    name: str
    # True when each run_bundle call is isolated from the others as stages within one run are
    # (a container each): then groups of stages may run at once.
    isolated_runs: bool
    # True when the bundle runs in an image the driver holds (an engine's, a verified root);
    # False where it runs in whatever environment this is (local): no layers of its own to verify.
    has_image: bool

    def environment(self) -> JsonObject:
        """Engine name, version, API version, OS/arch; what the attestation records."""
        ...

    def resolve(self, reference: str) -> ImageFacts:
        """Raise UsageError when the image does not exist."""
        ...

    def environment_fingerprint(self) -> str | None:
        """Where there is no image (local): the sha256 of the interpreter and its distributions as
        the probes see them, the identity `complete` compares; None where an image is the subject."""
        ...

    def image_source(self, image: ImageFacts, timeout: float | None) -> Source | None:
        """How the outside stages read the bytes of the image this driver ran (the docker driver:
        its engine's export, by image ID, read within `timeout` seconds; None: no limit), or None
        where the driver has no image of its own (local) and a registry copy or --source must do."""
        ...

    def left_behind(self) -> str | None:
        """After an interrupt: what may still be running and how to remove it; None: nothing."""
        ...

    def checked(self, image: ImageFacts) -> Checked:
        """What the driver checked of `image` (as resolve returned it) before running it."""
        ...

    def run_bundle(self, req: BundleRequest) -> BundleRun:
        """Run the bundle's stages (`req.stages`: only these, in plan order); stop early,
        removing everything, when `req.cancel` is set. Hand `req.event_key` to the controller
        through a channel no stage can read (never argv, never a file in the image)."""
        ...


class DriverBase:
    """The Driver protocol's no-op defaults: a driver overrides what it has (an image source of
    its own, a verification, a refusal, something left behind after an interrupt)."""

    isolated_runs = False
    has_image = True

    def image_source(self, image: ImageFacts, timeout: float | None) -> Source | None:
        return None

    def left_behind(self) -> str | None:
        return None

    def checked(self, image: ImageFacts) -> Checked:
        return Checked()

    def environment_fingerprint(self) -> str | None:
        return None


OnOutput = Callable[[bytes], None]

# One try of the bundle with one interpreter: the run, or why this interpreter cannot run it
# ("not found in the image", too old) so that the next one is tried.
Attempt = Callable[[str], BundleRun | str]


def first_usable(interpreters: Sequence[str], attempt: Attempt, cancel: threading.Event | None) -> BundleRun:
    """The run of the first interpreter `attempt` can start, with every one tried recorded; when
    none can, a run that says why, for each, in words (stops trying once `cancel` is set)."""
    tried: list[str] = []
    unusable: list[str] = []
    for interpreter in interpreters:
        if cancel is not None and cancel.is_set():
            break
        tried.append(interpreter)
        result = attempt(interpreter)
        if isinstance(result, BundleRun):
            result.tried = tried
            return result
        unusable.append(f"{interpreter}: {result}")
    found_any = any("not found" not in u for u in unusable)
    what = "no usable python interpreter" if found_any else "no python interpreter"
    return BundleRun(
        b"",
        b"",
        None,
        tried=tried,
        error=f"{what} in the image (tried {', '.join(tried)}): {'; '.join(unusable)}",
    )


class CappedBuffer:
    """Keeps at most `cap` bytes (the head), counts the rest; `on_feed` sees every chunk."""

    def __init__(self, cap: int, on_feed: OnOutput | None = None) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.total = 0
        self.on_feed = on_feed

    def feed(self, chunk: bytes) -> None:
        if self.on_feed is not None:
            self.on_feed(chunk)
        self.total += len(chunk)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]

    def value(self) -> bytes:
        return bytes(self.buf)
