"""Run an image list (an `Inventory` file): every image through its pipeline, every (official, mirror) pair through
compare, a bounded number at a time. Each item's outcome is data; one item that cannot run
(missing image, unreachable registry, a bug) is reported as such and never stops the others."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from imagegate.domain.results import exit_code
from imagegate.drivers.interface import Driver
from imagegate.errors import EXIT_UNDECIDED, EXIT_USAGE, ImagegateError
from imagegate.oci.layercheck import Progress
from imagegate.oci.pullfailure import worded
from imagegate.rootfs.known import Known, Tally
from imagegate.usecases import accept, runner
from imagegate.usecases.audit.imagelist import ImageEntry, LoadedImageList, MirrorEntry, MirrorSet

log = logging.getLogger("imagegate.audit")

# Worst first when picking the audit's exit code: an input error (fix the inventory), then a
# rejection, then "could not decide", then accepted; the same order as a run's verdict
# (FAIL before ERROR).
_SEVERITY = {0: 0, EXIT_UNDECIDED: 1, 1: 2, EXIT_USAGE: 3}


def worst(codes: Sequence[int]) -> int:
    return max(codes, key=lambda c: _SEVERITY.get(c, 1), default=0)


@dataclass(frozen=True)
class ItemResult:
    kind: Literal["image", "mirror"]
    name: str
    subject: str  # the image, or "OFFICIAL -> MIRROR"
    outcome: str  # a run's verdict, a compare verdict, or ERROR when the item could not run
    exit_code: int
    detail: str
    duration_s: float
    evidence: str | None = None  # the run's attempt folder
    data: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchResult:
    image_list: str  # the file's path
    started_at: str
    finished_at: str
    items: list[ItemResult]
    blobs: Tally | None = None  # the layers read, and those known (read once in the run, or a verified pair)
    skipped: tuple[str, ...] = ()  # listed names that are no tag or repository

    @property
    def exit_code(self) -> int:
        return worst([i.exit_code for i in self.items])


@dataclass(frozen=True)
class BatchOptions:
    out: Path = Path("imagegate-runs")
    jobs: int = 4
    platform: str | None = None  # overrides the inventory's default for mirror pairs
    # Each image's attempt is signed as `run` signs it (the key checked before any item runs).
    outputs: accept.Outputs = accept.Outputs()
    # The blobs known for the whole run: each unique blob read once across its mirror pairs.
    known: Known | None = None
    progress: Progress | None = None  # the mirror pairs' blob reads, byte by byte


DriverFactory = Callable[[], Driver]
OnDone = Callable[[ItemResult], None]
OnListed = Callable[[int], None]  # a mirror set listed: how many more items than it counted for


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _failed(
    kind: Literal["image", "mirror"], name: str, subject: str, e: BaseException, t0: float
) -> ItemResult:
    if isinstance(e, ImagegateError):
        e = worded(e)
        detail = str(e) + (f" (hint: {e.hint})" if e.hint else "")
        code = e.exit_code
    else:  # a bug in one item must not lose the others' results
        detail, code = f"internal error: {type(e).__name__}: {e}", EXIT_UNDECIDED
    log.debug("%s %s failed", kind, name, exc_info=e)
    return ItemResult(kind, name, subject, "ERROR", code, detail, time.monotonic() - t0)


def run_image(
    entry: ImageEntry, inv: LoadedImageList, opts: BatchOptions, make_driver: DriverFactory
) -> ItemResult:
    name = entry.name or entry.image
    t0 = time.monotonic()
    pipeline = entry.pipeline or inv.image_list.defaults.pipeline
    require = entry.require_complete
    if require is None:
        require = inv.image_list.defaults.require_complete
    try:
        ropts = runner.RunOptions(pipeline=pipeline, modules=entry.modules, out=opts.out)
        notify = lambda m: log.debug("%s: %s", name, m)  # noqa: E731
        prep = runner.prepare(ropts)
        # The entry's timeout is its deadline, within the command's: getting the image, the stages.
        with accept.within(prep, entry.timeout):
            observer = runner.DriverObserver(make_driver(), entry.image, ropts, notify)
            # The same use case as `run`: the attempt concluded, signed, its statement written.
            done = accept.accept(accept.Request(prep, observer, opts.out, opts.outputs), notify)
    except Exception as e:
        return _failed("image", name, entry.image, e, t0)
    record = done.record
    problems = [f"{s.token}: {s.detail}" for s in record.stages if s.status.value != "PASS"]
    return ItemResult(
        "image",
        name,
        entry.image,
        record.verdict,
        # run's own (a verdict that reached no level is rejected), and the entry's --require-complete
        max(done.exit_code, exit_code(record.verdict, require_complete=require)),
        "; ".join(problems) or f"{len(record.stages)} stages passed",
        time.monotonic() - t0,
        record.attempt_dir,
        {
            "pipeline": dict(record.pipeline),
            "config_digest": record.image.config_digest,
            "attestation": str(done.signed.dsse_path) if done.signed else None,
        },
    )


def run_mirror(entry: MirrorEntry, inv: LoadedImageList, opts: BatchOptions) -> ItemResult:
    from imagegate.oci.compare import compare
    from imagegate.oci.sources.interface import ImageSource, Source
    from imagegate.oci.transports import open_source

    subject = f"{entry.official} -> {entry.mirror}"
    name = entry.name or entry.mirror
    t0 = time.monotonic()
    platform = opts.platform or entry.platform or inv.image_list.defaults.platform
    opened: list[Source] = []
    try:
        for spec in (entry.official, entry.mirror):
            opened.append(open_source(spec, platform=platform, insecure=entry.insecure))
        result = compare(opened[0], opened[1], deep=entry.deep, known=opts.known, progress=opts.progress)
    except Exception as e:
        return _failed("mirror", name, subject, e, t0)
    finally:
        for s in opened:
            if isinstance(s, ImageSource):
                s.close()
    return ItemResult(
        "mirror",
        name,
        subject,
        result.verdict.value,
        result.exit_code,
        result.sentence,
        time.monotonic() - t0,
        data=dict[str, object](result.to_dict()),
    )


def run_batch(
    inv: LoadedImageList,
    opts: BatchOptions,
    make_driver: DriverFactory,
    on_done: OnDone = lambda _r: None,
    on_listed: OnListed = lambda _n: None,
) -> BatchResult:
    """Every item, at most `opts.jobs` at a time; results in inventory order (a mirror set's pairs
    in listing order, after the inventory's own mirrors)."""
    started = _now()
    images, skipped = inv.image_list.images, list[str]()
    mirrors: list[MirrorEntry] = list(inv.image_list.mirrors)
    listed: list[ItemResult] = []  # a mirror set that could not be listed: an item of its own
    for ms in inv.image_list.mirror_sets:
        try:
            pairs = _expand(ms, skipped)
            mirrors += pairs
            on_listed(len(pairs) - 1)
        except Exception as e:
            listed.append(
                _failed("mirror", ms.name or ms.mirror, f"{ms.official} -> {ms.mirror}", e, time.monotonic())
            )
            on_done(listed[-1])
    log.info(
        "audit %s: %d images, %d mirror pairs, %d at a time", inv.path, len(images), len(mirrors), opts.jobs
    )

    def done(r: ItemResult) -> ItemResult:
        log.info("%s %s: %s (exit %d, %.1f s)", r.kind, r.name, r.outcome, r.exit_code, r.duration_s)
        on_done(r)
        return r

    def one_image(e: ImageEntry) -> ItemResult:
        return done(run_image(e, inv, opts, make_driver))

    def one_mirror(m: MirrorEntry) -> ItemResult:
        return done(run_mirror(m, inv, opts))

    with ThreadPoolExecutor(max_workers=max(1, opts.jobs), thread_name_prefix="audit") as pool:
        futures = [pool.submit(one_image, e) for e in images]
        futures += [pool.submit(one_mirror, m) for m in mirrors]
        items = [f.result() for f in futures]
    tally = opts.known.tally if opts.known is not None else None
    return BatchResult(str(inv.path), started, _now(), items + listed, tally, tuple(skipped))


def _expand(ms: MirrorSet, skipped: list[str]) -> list[MirrorEntry]:
    from imagegate.usecases.audit.expand import expand  # the registry client loads when a set is listed

    return expand(ms, skipped)
