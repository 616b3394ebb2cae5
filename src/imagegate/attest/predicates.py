"""The predicate types imagegate signs, by the short names `verify --type` takes. Apart from
verify.py, which mirror.py and the fleet's node statement import: naming them all there made a circle."""

from __future__ import annotations

from imagegate.attest.mirror import MIRROR_PREDICATE_TYPE
from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
from imagegate.attest.statement import PREDICATE_TYPE
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE
from imagegate.domain.statements import NODE_PREDICATE_TYPE
from imagegate.errors import UsageError


def predicate_type_named(name: str) -> str:
    """`--type`: a predicate type URI as it is, or the short name of one imagegate signs."""
    short = {
        "acceptance": PREDICATE_TYPE,
        "index": INDEX_PREDICATE_TYPE,
        "vsa": VSA_PREDICATE_TYPE,
        "test-result": TEST_RESULT_PREDICATE_TYPE,
        "mirror": MIRROR_PREDICATE_TYPE,
        "node-check": NODE_PREDICATE_TYPE,
    }
    if "://" in name:
        return name
    if name not in short:
        raise UsageError(
            f"--type {name!r}: not a predicate type URI nor a short name",
            hint=f"give a URI, or one of {', '.join(short)}",
        )
    return short[name]
