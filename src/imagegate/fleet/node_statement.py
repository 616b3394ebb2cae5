"""A node's check as a signed fact: an in-toto statement whose subject is the node (its name, and
each of its GPUs by UUID) and whose predicate carries the node check's verdict, the node's figures
and the image that ran the check. The acceptance statement's subject is an image; a fleet's
scheduler, labeller or auditor asks about a node, so the node is the subject here.

The subject's digests are sha256 of the names they stand beside: in-toto matches subjects by
digest, and a verifier recomputes them, so a subject renamed after signing fails twice (the
signature, and the digest beside the new name).

The statement names the attempt it was made from (its id, signed in the attempt's own statement
too), so an attempt is bound to one node: `fleet report` takes NODE=ATTEMPT only where the node
statement beside the attempt names that node and that attempt (`problems`)."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate import __version__
from imagegate._support.files import read_named
from imagegate._support.jsontypes import JsonMapping, JsonObject, freeze_object, items, obj, path
from imagegate.attest import bundle, dsse
from imagegate.attest.keys import PublicKey, SigningKey
from imagegate.attest.sign import create_once, seal, serialize
from imagegate.attest.verify import certified, load_attempt
from imagegate.domain.statements import NODE_PREDICATE_TYPE, NodeCheck, Statement, Subject
from imagegate.errors import ImagegateError, UsageError
from imagegate.fleet import judge as fleet  # the functions read `fleet.X`, as when it sat apart
from imagegate.oci import untrusted_json

if TYPE_CHECKING:
    from imagegate.attest.keyless import Expected
    from imagegate.domain.results import RunRecord

NODE_FILE = "node-check.dsse.json"
NODE_BUNDLE_FILE = "node-check.sigstore.json"  # where verify's bundle_material looks beside it
MAX_ENVELOPE_BYTES = 1 << 20  # a node's statement is a few KiB: anything far larger is not one
_GPU_PREFIX = "GPU-"  # nvidia-smi writes the UUID with it, torch without: one spelling signed


def gpu_uuids(data: JsonMapping) -> list[str]:
    """The node's GPU UUIDs from its check's data: nvidia-smi's (the host's view), else torch's."""
    found: list[str] = []
    host = items(path(data, "host", "nvidia_smi"))
    devices = items(path(data, "facts", "devices"))
    for row in [*host, *devices]:
        raw = row.get("uuid") if isinstance(row, Mapping) else None
        if isinstance(raw, str) and raw.strip():
            uuid = raw.strip()
            uuid = uuid if uuid.startswith(_GPU_PREFIX) else _GPU_PREFIX + uuid
            if uuid not in found:
                found.append(uuid)
    return found


def _digest(name: str) -> JsonObject:
    return {"sha256": hashlib.sha256(name.encode()).hexdigest()}


def subject(node: str, uuids: list[str]) -> list[JsonObject]:
    """The node first, then each GPU as node/UUID."""
    names = [f"node/{node}", *(f"node/{node}/gpu/{u}" for u in uuids)]
    return [{"name": n, "digest": _digest(n)} for n in names]


def node_statement(
    node: str, status: str, detail: str, data: JsonMapping, image: JsonMapping, attempt: str
) -> Statement[NodeCheck]:
    """The statement for one node: `status` and `detail` are the node check stage's, `data` what
    it measured, `image` the reference and digest of the image that ran it, `attempt` the id of
    the attempt it ran in."""
    uuids = gpu_uuids(data)
    return Statement(
        subject=tuple(Subject.from_json(s) for s in subject(node, uuids)),
        predicate_type=NODE_PREDICATE_TYPE,
        predicate=NodeCheck(
            node=node,
            gpus=tuple(uuids),
            model=fleet.gpu_model(data),
            verdict=status,
            detail=detail,
            figures=fleet.figures_of(data),
            image=freeze_object(image),
            attempt=attempt,
            checked_on=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            version=__version__,
        ),
    )


def sign_node(folder: Path, statement: Statement[NodeCheck] | JsonMapping, key: SigningKey) -> Path:
    """The DSSE envelope of `statement`, written once into `folder` (never replacing one), and
    its Sigstore bundle beside it (NODE_BUNDLE_FILE): keyless, the bundle carries the certificate,
    log entry and timestamps that prove who signed it."""
    envelope, material = seal(serialize(statement), key)
    path = folder / NODE_FILE
    for where, data in (
        (path, envelope.to_json()),
        (folder / NODE_BUNDLE_FILE, bundle.json_of(envelope, material)),
    ):
        create_once(where, data, "a node's check is signed once", "check the node again")
    return path


def sign_attempt(node: str, record: RunRecord, key: SigningKey) -> Path | None:
    """The node's statement from an attempt's node check, signed beside it: what `fleet run --key`
    writes for each node. None when the attempt ran no node check (nothing to say of the node)."""
    stage = fleet.node_check(record)
    if stage is None:
        return None
    image = {"reference": record.image.reference, "digest": record.image.manifest_digest}
    statement = node_statement(node, stage.status.value, stage.detail, stage.data, image, record.attempt_id)
    return sign_node(Path(record.attempt_dir), statement, key)


def verify_node(raw: bytes, key: PublicKey) -> dict[str, object]:
    """The statement of a node's envelope, once its signature verifies with `key`, its type is
    the node check's and each subject's digest is its name's. UsageError otherwise, saying which."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise UsageError(f"node statement: over {MAX_ENVELOPE_BYTES} bytes: not one imagegate signs")
    envelope = dsse.from_json(raw)
    if envelope.payload_type != dsse.INTOTO_PAYLOAD_TYPE or not envelope.verified_by(key):
        raise UsageError(
            "node statement: the signature does not verify with the given key",
            hint="give the public key of the key that signed the fleet run",
        )
    try:
        statement = untrusted_json.loads(envelope.payload, max_bytes=MAX_ENVELOPE_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"node statement: payload: {e}") from e
    if not isinstance(statement, dict) or statement.get("predicateType") != NODE_PREDICATE_TYPE:
        raise UsageError(f"node statement: not a {NODE_PREDICATE_TYPE} statement")
    predicate = statement.get("predicate") or {}
    node, uuids = predicate.get("node"), predicate.get("gpus")
    if (
        not isinstance(node, str)
        or not isinstance(uuids, list)
        or statement.get("subject") != subject(node, [str(u) for u in uuids])
    ):
        raise UsageError(f"node statement: its subject is not node {node!r} and its GPUs {uuids!r}")
    return statement


def ran_elsewhere(node: str, record: RunRecord) -> list[str]:
    """The node the attempt's own (signed) environment says it ran on, where that is not `node`
    (a Pod's run names its node; a run on a host names none)."""
    ran_on = record.environment.get("node")
    if ran_on and ran_on != node:
        return [f"the attempt ran on node {ran_on!r} (its signed environment), not {node!r}"]
    return []


def problems(
    node: str, attempt: Path, record: RunRecord, key: PublicKey | None, keyless: Expected | None = None
) -> list[str]:
    """Why `attempt` (read as `record`) is not node `node`'s own node check: it ran on another
    node, or the node statement beside it names another node or another attempt. With `key`,
    also: the attempt does not verify as `imagegate verify` checks it (its signature, every
    evidence file it lists), the node statement is missing, or does not verify. `keyless`: `key`
    is the one the attempt's certificate proved the identity's (None: it proved none, said by the
    caller), and the node statement must prove that identity by its own bundle. Without either
    the node statement is read unverified, and an attempt without one is taken at its word."""
    found = ran_elsewhere(node, record)
    checked = key is not None or keyless is not None
    if key is not None:
        found += _attempt_verifies(attempt, key)
    path = attempt / NODE_FILE
    if not path.is_file():
        if checked:
            found.append(
                f"no {NODE_FILE} beside the attempt: nothing signed says which node it ran on "
                "(fleet run and fleet collect sign one with --key)"
            )
        return found
    try:
        raw = read_named(path, what="the node statement", max_bytes=MAX_ENVELOPE_BYTES)
        statement = _verified(path, raw, key, keyless) if checked else _unverified(raw)
    except UsageError as e:
        return [*found, f"{NODE_FILE}: {e}"]
    return found + _names(statement, node, record.attempt_id)


def _verified(path: Path, raw: bytes, key: PublicKey | None, keyless: Expected | None) -> dict[str, object]:
    """The node statement verified with `key`, or keyless with the key its own bundle (beside it)
    proves was the identity's."""
    if keyless is not None:
        key, said = certified(path, dsse.from_json(raw), keyless)
        if key is None:
            raise UsageError(f"node statement: not signed by {keyless}: {said}")
    assert key is not None
    return verify_node(raw, key)


def _attempt_verifies(attempt: Path, key: PublicKey) -> list[str]:
    """What `imagegate verify` finds wrong with the attempt folder: nothing, or what fails."""
    try:
        load_attempt(attempt, key, use="so it is no node's check", hint="check the node again")
    except ImagegateError as e:
        return [str(e)]
    return []


def _unverified(raw: bytes) -> dict[str, object]:
    """The statement of a node's envelope, its signature not checked (no key was given)."""
    try:
        statement = untrusted_json.loads(dsse.from_json(raw).payload, max_bytes=MAX_ENVELOPE_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"node statement: payload: {e}") from e
    if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
        raise UsageError("node statement: not an in-toto statement with a predicate")
    return statement


def _names(statement: JsonMapping, node: str, attempt: str) -> list[str]:
    """Where the node statement names another node, or another attempt, than the one given."""
    predicate = obj(statement.get("predicate"))
    found = []
    if predicate.get("node") != node:
        found.append(
            f"{NODE_FILE} names node {predicate.get('node')!r}, not {node!r}: an attempt is taken "
            "only as the node its statement names"
        )
    if predicate.get("attempt") != attempt:
        found.append(
            f"{NODE_FILE} was signed for attempt {predicate.get('attempt')!r}, not this one ({attempt})"
        )
    return found
