"""`imagegate complete` runs against the image or environment the earlier attempt judged, and
refuses (exit 3) any other, naming both (complete.check_same_subject): the image ID always, the
manifest digest where both runs know one, for `run --here` the environment's fingerprint. The
earlier attempt is given as `complete` holds it once it verified (its signed statement); what is
found now, as the driver reports it. tests/run/test_gpu.py runs the same through the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imagegate.domain.results import ImageFacts
from imagegate.errors import UsageError
from imagegate.usecases.complete import Earlier, check_same_subject

CONFIG, OTHER_CONFIG = "sha256:" + "c" * 64, "sha256:" + "d" * 64
MANIFEST, OTHER_MANIFEST = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def _earlier(image: dict[str, Any] | None = None, fingerprint: str | None = None) -> Earlier:
    predicate: dict[str, Any] = {"attempt": {"id": "A"}, "image": image or {}}
    if fingerprint is not None:
        predicate["environment"] = {"fingerprint": {"sha256": fingerprint}}
    return Earlier(Path("A"), {"predicate": predicate}, b"", "sha256:" + "0" * 64)


def _now(config: str | None = CONFIG, manifest: str | None = None) -> ImageFacts:
    return ImageFacts("r/app:1", config, manifest)


def test_the_same_image_by_its_id_and_digest_is_completed() -> None:
    pulled = _earlier({"configDigest": CONFIG, "manifestDigest": MANIFEST})
    check_same_subject(pulled, _now(manifest=MANIFEST), None)
    # found now only in the engine, without its registry digest: the image ID decides
    check_same_subject(pulled, _now(manifest=None), None)
    # judged before it was pushed (no digest then), pushed since: the image ID decides
    check_same_subject(_earlier({"configDigest": CONFIG}), _now(manifest=MANIFEST), None)


@pytest.mark.parametrize(
    ("what", "then", "now"),
    [
        ("image ID", CONFIG, OTHER_CONFIG),
        ("image ID", OTHER_CONFIG, CONFIG),
        ("digest", MANIFEST, OTHER_MANIFEST),
        ("digest", OTHER_MANIFEST, MANIFEST),
    ],
)
def test_another_image_is_refused_naming_both(what: str, then: str, now: str) -> None:
    """Another build (image ID), or the same name now on another manifest (digest); either
    sorting before or after the one judged."""
    if what == "image ID":
        earlier, found = _earlier({"configDigest": then, "manifestDigest": MANIFEST}), _now(now, MANIFEST)
    else:
        earlier, found = _earlier({"configDigest": CONFIG, "manifestDigest": then}), _now(CONFIG, now)
    with pytest.raises(UsageError) as e:
        check_same_subject(earlier, found, None)
    assert str(e.value) == f"r/app:1: {what} {now} is not the {what} {then} that attempt A judged"


@pytest.mark.parametrize(("then", "now"), [("e" * 64, "f" * 64), ("f" * 64, "e" * 64)])
def test_another_environment_is_refused_naming_both_fingerprints(then: str, now: str) -> None:
    earlier = _earlier(fingerprint=then)
    check_same_subject(earlier, _now(config=None), then)
    with pytest.raises(UsageError) as e:
        check_same_subject(earlier, _now(config=None), now)
    assert str(e.value).startswith(
        f"this environment (fingerprint sha256:{now}) is not the one attempt A judged (fingerprint sha256:{then})"
    )
