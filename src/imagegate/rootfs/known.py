"""Blobs known by their digest, for every reader of layers (`layers`, `compare`, `audit`): a layer
is read at most once per run, and not at all where this machine recorded a verified pair for it.

A fact about a blob (its digest -> its size and diffID, hashed here from its bytes) is content,
never identity: it may stand in for reading the blob again wherever a manifest names that exact
digest and size and its config that diffID at that position (`reuse.known_pair`'s rule). Two
sources come to it: the pair store (rootfs/pairs.py, written only after a whole matching pass,
left out with `--no-cache`) and this run's own reads. Readers of the same digest at the same time
wait for the one read in flight (twenty tags over one base read the base once); a read that did
not verify vouches for nothing, and the next reader reads its own source's bytes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from imagegate._support import deadline, interrupts
from imagegate.errors import ImagegateError
from imagegate.oci.layercheck import LayerResult, LayerStatus
from imagegate.oci.manifest import Descriptor
from imagegate.rootfs.cache import RootCache
from imagegate.rootfs.pairs import Pair, PairStore
from imagegate.rootfs.reuse import known_pair, pair_result

# How often a reader waiting on another's read of the same blob looks at a stop or the deadline
# (the read itself ends at once on either: it is cut by interrupts.stop).
_POLL_S = 0.25


@dataclass
class Tally:
    """What the run read and what it knew: blobs and bytes."""

    read: int = 0
    read_bytes: int = 0
    known: int = 0
    known_bytes: int = 0


class Known:
    """layercheck.KnownBlobs over the pair store `store` (None: this run's reads only). Safe
    across threads: one object serves every image a run reads."""

    def __init__(self, store: PairStore | None):
        self.store = store
        self.tally = Tally()
        self._lock = threading.Lock()
        self._memory: dict[str, Pair] = {}  # verified in this run, by digest
        self._flights: dict[str, threading.Event] = {}  # a read of that digest in progress

    def once(
        self, index: int, desc: Descriptor, expected_diff_id: str, read: Callable[[], LayerResult]
    ) -> LayerResult:
        digest = desc.digest
        if digest is None:  # an archive member named by its path: nothing to know it by
            return self._count(read(), read_now=True)
        while True:
            hit = self._vouched(index, desc, expected_diff_id)
            if hit is not None:
                return self._count(hit, read_now=False)
            with self._lock:
                flight = self._flights.get(digest)
                mine = flight is None
                if flight is None:
                    flight = self._flights[digest] = threading.Event()
            if mine:
                try:
                    result = read()
                    self._record(result)
                    return self._count(result, read_now=True)
                finally:
                    with self._lock:
                        del self._flights[digest]
                    flight.set()
            _wait(flight, digest)
            # The other read ended: verified, its pair vouches now; else this reader reads its own.

    def _vouched(self, index: int, desc: Descriptor, expected_diff_id: str) -> LayerResult | None:
        with self._lock:
            mine = self._memory.get(desc.digest or "")
        if mine is not None and mine.size == desc.size and mine.diff_id == expected_diff_id:
            return replace(
                pair_result(index, desc, mine),
                detail=f"read once in this run (verified at {mine.recorded_at}) for another image "
                "naming the same digest: not read again",
            )
        pair = known_pair(self.store, desc, expected_diff_id) if self.store is not None else None
        return None if pair is None else pair_result(index, desc, pair)

    def _record(self, result: LayerResult) -> None:
        """A result of a whole pass that matched the manifest's digest and size and the config's
        diffID is known for the rest of the run (and kept in the pair store); nothing else."""
        digest, size, diff_id = result.actual_digest, result.actual_size, result.actual_diff_id
        if result.status is not LayerStatus.OK or result.pair_recorded_at is not None:
            return
        if digest is None or digest != result.expected_digest or size != result.expected_size:
            return
        if diff_id is None or diff_id != result.expected_diff_id or size is None:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._lock:
            self._memory[digest] = Pair(
                digest, size, diff_id, now, result.compression, result.uncompressed_size
            )
        if self.store is not None:
            self.store.record(result)

    def _count(self, result: LayerResult, *, read_now: bool) -> LayerResult:
        size = result.actual_size or 0
        with self._lock:
            if read_now:
                self.tally.read += 1
                self.tally.read_bytes += size
            else:
                self.tally.known += 1
                self.tally.known_bytes += size
        return result


@contextlib.contextmanager
def known_blobs(cache_dir: str | None, no_cache: bool, say: Callable[[str], None]) -> Iterator[Known]:
    """What a reader (a command, the layers stage) need not read again: its own reads, and the
    root cache's verified pairs unless `no_cache`. A cache that cannot be used (a read-only home
    in a Pod, a --cache-dir that is no folder) is said through `say`, and every blob is read."""
    if no_cache:
        yield Known(None)
        return
    try:
        cache = RootCache(cache_dir)
    except ImagegateError as e:
        say(f"no verified pairs used ({e}); every blob is read")
        yield Known(None)
        return
    with cache:
        yield Known(cache.pairs)


def _wait(flight: threading.Event, digest: str) -> None:
    """Until the read in flight ends; a stop or the deadline ends the wait first."""
    while not flight.wait(_POLL_S):
        interrupts.check_stop(f"waiting for the read of {digest}")
        deadline.check(f"waiting for another read of {digest}")
