"""Attestations as OCI 1.1 referrers, beside the cosign `.att` tag: one artifact manifest per
DSSE envelope, its `subject` the image's manifest, `artifactType` the DSSE media type and the
`in-toto.io/predicate-type` annotation, pushed by digest. A registry that serves the referrers
API says so (`OCI-Subject`) and indexes it; for one that does not, the OCI tag-schema fallback:
an image index tagged `sha256-<hex>` listing the referrers, kept here. Reading asks the API first
and falls back to that tag, as the distribution spec says a client does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagegate.attest import attach, dsse
from imagegate.attest.attach import (
    DSSE_LAYER_MEDIA_TYPE,
    INTOTO_PREDICATE_TYPE_ANNOTATION,
    Attached,
    FetchedEnvelope,
    RemoteImage,
    read_blob,
    replaced_by,
    statement_of,
)
from imagegate.attest.envelopes import read_envelopes
from imagegate.attest.replace import Replaced, locked
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json
from imagegate.oci.digest import digest_of, is_digest, split_digest
from imagegate.oci.manifest import OCI_INDEX, OCI_MANIFEST
from imagegate.oci.reference import Reference
from imagegate.oci.registry import NotFound, RegistryClient, RegistryError

ARTIFACT_TYPE = DSSE_LAYER_MEDIA_TYPE
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
MAX_REFERRERS = 1000  # read at most this many; an index is untrusted input like any answer


@dataclass(frozen=True)
class Referred:
    manifest_digest: str  # of the artifact manifest
    via: str  # "the referrers API" or "tag sha256-<hex>" (the fallback index)
    already: bool  # it was listed there already
    replaced: tuple[Replaced, ...] = ()  # earlier referrers deleted or unlisted
    # Earlier referrers it replaces that are still listed: the registry refused to delete them.
    remaining: tuple[Replaced, ...] = ()


def fallback_tag(digest: str) -> str:
    algo, hexd = split_digest(digest)
    return f"{algo}-{hexd}"


def _subject(client: RegistryClient, repo: str, digest: str) -> dict[str, Any]:
    found = client.head_manifest(repo, digest)
    if found is None:
        raise UsageError(f"{repo}@{digest}: not found in the registry", hint="push the image first")
    _, media_type, size = found
    return {"mediaType": media_type.split(";")[0].strip(), "digest": digest, "size": size}


def artifact_manifest(subject: dict[str, Any], layer: bytes, predicate_type: str, layer_digest: str) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": _EMPTY_DIGEST, "size": len(EMPTY)},
        "layers": [{"mediaType": DSSE_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": len(layer)}],
        "subject": subject,
        "annotations": {INTOTO_PREDICATE_TYPE_ANNOTATION: predicate_type},
    }
    return json.dumps(manifest, separators=(",", ":")).encode()


_EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def refer(client: RegistryClient, image: RemoteImage, envelope: dsse.Envelope) -> Referred:
    """Push `envelope` as a referrer of `image` (whose subject the caller has checked), then
    remove the earlier referrers it replaces (attest/replace.py): unlisted from the fallback
    index, deleted where the registry indexes them itself."""
    repo = image.reference.repository
    layer = envelope.to_json(indent=None).rstrip(b"\n")
    statement = statement_of(envelope)
    predicate_type = str(statement.get("predicateType", ""))
    client.upload_blob(repo, EMPTY, _EMPTY_DIGEST)
    layer_digest = client.upload_blob(repo, layer)
    raw = artifact_manifest(_subject(client, repo, image.digests[0]), layer, predicate_type, layer_digest)
    new_digest = digest_of(raw)
    stale = {
        digest: gone
        for digest, _, env in _referred(client, image)
        if digest != new_digest
        and (gone := replaced_by(statement, env, image, f"referrer {digest}")) is not None
    }
    digest, indexed = client.put_referrer(repo, raw, OCI_MANIFEST)
    if indexed:
        # Pushed first, deleted after: a reader in between sees both, never neither.
        refused = [gone for d, gone in stale.items() if not client.delete_manifest(repo, d)]
        done = tuple(gone for gone in stale.values() if gone not in refused)
        return Referred(digest, "the referrers API", False, done, tuple(refused))
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(raw),
        "artifactType": ARTIFACT_TYPE,
        "annotations": {INTOTO_PREDICATE_TYPE_ANNOTATION: predicate_type},
    }
    referred = _add_to_fallback(client, repo, image.digests[0], descriptor, set(stale))
    for d in stale:
        # Unlisted is enough for a reader of the fallback tag; the manifest itself is removed
        # where the registry allows it, and left, unread, where it does not.
        client.delete_manifest(repo, d)
    return Referred(referred.manifest_digest, referred.via, referred.already, tuple(stale.values()))


def _fallback_index(client: RegistryClient, repo: str, tag: str) -> dict[str, Any]:
    try:
        found = client.get_manifest(repo, tag, accept=(OCI_INDEX,))
    except NotFound:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    try:
        index = untrusted_json.loads(found.raw)
    except untrusted_json.UntrustedJSONError as e:
        raise RegistryError(f"{repo}:{tag}: the referrers fallback index is {e}") from e
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise RegistryError(
            f"{repo}:{tag}: the tag is there but is not an image index: not a referrers fallback",
            hint="another tool uses this tag; remove it, or read the attestation from the .att tag",
        )
    return index


def _add_to_fallback(
    client: RegistryClient, repo: str, digest: str, descriptor: dict[str, Any], unlist: set[str]
) -> Referred:
    tag = fallback_tag(digest)
    index = _fallback_index(client, repo, tag)
    listed = [d for d in index["manifests"] if not (isinstance(d, dict) and d.get("digest") in unlist)]
    already = any(isinstance(d, dict) and d.get("digest") == descriptor["digest"] for d in listed)
    if already and len(listed) == len(index["manifests"]):
        return Referred(descriptor["digest"], f"tag {tag}", True)
    index["manifests"] = listed if already else [*listed, descriptor]
    client.put_manifest(repo, tag, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)
    return Referred(descriptor["digest"], f"tag {tag}", already)


def _listed(client: RegistryClient, repo: str, digest: str) -> tuple[list[dict[str, Any]], str]:
    """The referrers listed for `digest` and where: the API, else the fallback tag."""
    raw, via = client.referrers(repo, digest), "the referrers API"
    if raw is None:
        via = f"tag {fallback_tag(digest)}"
        try:
            raw = client.get_manifest(repo, fallback_tag(digest), accept=(OCI_INDEX,)).raw
        except NotFound:
            return [], via
    try:
        index = untrusted_json.loads(raw)
    except untrusted_json.UntrustedJSONError as e:
        raise RegistryError(f"{repo}: the referrers of {digest} ({via}) are {e}") from e
    listed = index.get("manifests") if isinstance(index, dict) else None
    out = [
        d
        for d in (listed if isinstance(listed, list) else [])[:MAX_REFERRERS]
        if isinstance(d, dict) and d.get("artifactType") == ARTIFACT_TYPE and is_digest(str(d.get("digest")))
    ]
    return out, via


def _referred(client: RegistryClient, image: RemoteImage) -> list[tuple[str, str, dsse.Envelope]]:
    """(manifest digest, where it is listed, envelope) of every DSSE envelope referring to the
    image. A listed manifest whose subject is another image is not ours to read (an index anyone
    could push)."""
    repo, digest = image.reference.repository, image.digests[0]
    descriptors, via = _listed(client, repo, digest)
    out = []
    for d in descriptors:
        try:
            manifest = untrusted_json.loads(
                client.get_manifest(repo, d["digest"], accept=(OCI_MANIFEST,)).raw
            )
        except (NotFound, untrusted_json.UntrustedJSONError):
            continue
        if not isinstance(manifest, dict) or (manifest.get("subject") or {}).get("digest") != digest:
            continue
        layers = [x for x in manifest.get("layers") or [] if isinstance(x, dict)]
        if (
            len(layers) != 1
            or layers[0].get("mediaType") != DSSE_LAYER_MEDIA_TYPE
            or not is_digest(str(layers[0].get("digest")))
        ):
            continue
        try:
            env = dsse.from_json(read_blob(client, repo, str(layers[0]["digest"])))
        except UsageError:
            continue
        out.append((str(d["digest"]), via, env))
    return out


def fetch(client: RegistryClient, image: RemoteImage) -> list[FetchedEnvelope]:
    """Every DSSE envelope referring to the image, through the API or the fallback tag."""
    where = f"{image.reference.registry}/{image.reference.repository}"
    return [FetchedEnvelope(f"{where} referrer {d} ({via})", env) for d, via, env in _referred(client, image)]


def attach_and_refer(
    client: RegistryClient, ref: Reference, envelope: dsse.Envelope
) -> tuple[Attached, Referred]:
    """Both places admission controllers look: the `.att` tag (attach.attach, which checks the
    subject) and a referrer of the same manifest digest (pinned: a moved tag cannot split them).
    Each is read, changed and written back under the image's lock (attest/replace.py)."""
    pinned = attach.resolve(client, ref).reference
    with locked(str(pinned)):
        done = attach.attach(client, pinned, envelope)
        image = attach.resolve(client, attach.parse_image(done.reference))
        return done, refer(client, image, envelope)


def attach_file(path: Path, image: str, *, insecure: bool = False) -> list[tuple[Attached, Referred]]:
    """Attach the attestation in `path` (any form `verify` reads) to `image` in its registry; an
    attempt's acceptance brings the VSA and test-result signed beside it (`standard_beside`)."""
    envelopes = read_envelopes(path)
    if len(envelopes) != 1:
        raise UsageError(f"attestation {path}: holds {len(envelopes)} envelopes; attach one at a time")
    ref = attach.parse_image(image)
    with attach.client_for(ref, insecure=insecure) as client:
        return [
            attach_and_refer(client, ref, env) for env in (envelopes[0], *standard_beside(path, envelopes[0]))
        ]


def standard_beside(path: Path, envelope: dsse.Envelope) -> list[dsse.Envelope]:
    """The VSA and test-result in the attempt folder holding the acceptance `path`, when they are
    about the same subject and pipeline: attached with it, as `run --attach` does, so that the
    statements a controller reads say the same verdict. None for any other attestation."""
    from imagegate.attest import replace, sign
    from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
    from imagegate.attest.statement import PREDICATE_TYPE

    statement = statement_of(envelope)
    if statement.get("predicateType") not in (PREDICATE_TYPE, INDEX_PREDICATE_TYPE):
        return []
    out = []
    for name in (sign.VSA_FILE, sign.TEST_RESULT_FILE):
        try:
            (env,) = read_envelopes(path.parent / name)
            st = statement_of(env)
        except (UsageError, OSError, ValueError):
            continue
        if st.get("subject") == statement.get("subject") and replace.pipeline_of(st) == replace.pipeline_of(
            statement
        ):
            out.append(env)
    return out


def fetch_all(client: RegistryClient, image: RemoteImage) -> list[FetchedEnvelope]:
    """The `.att` tag's envelopes, then the referrers'."""
    return attach.fetch(client, image) + fetch(client, image)
