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
    statement_of,
)
from imagegate.attest.envelopes import read_envelopes
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json
from imagegate.oci.digest import is_digest, split_digest
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
    """Push `envelope` as a referrer of `image` (whose subject the caller has checked)."""
    repo = image.reference.repository
    layer = envelope.to_json(indent=None).rstrip(b"\n")
    predicate_type = str(statement_of(envelope).get("predicateType", ""))
    client.upload_blob(repo, EMPTY, _EMPTY_DIGEST)
    layer_digest = client.upload_blob(repo, layer)
    raw = artifact_manifest(_subject(client, repo, image.digests[0]), layer, predicate_type, layer_digest)
    digest, indexed = client.put_referrer(repo, raw, OCI_MANIFEST)
    if indexed:
        return Referred(digest, "the referrers API", False)
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(raw),
        "artifactType": ARTIFACT_TYPE,
        "annotations": {INTOTO_PREDICATE_TYPE_ANNOTATION: predicate_type},
    }
    return _add_to_fallback(client, repo, image.digests[0], descriptor)


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


def _add_to_fallback(client: RegistryClient, repo: str, digest: str, descriptor: dict[str, Any]) -> Referred:
    tag = fallback_tag(digest)
    index = _fallback_index(client, repo, tag)
    if any(isinstance(d, dict) and d.get("digest") == descriptor["digest"] for d in index["manifests"]):
        return Referred(descriptor["digest"], f"tag {tag}", True)
    index["manifests"].append(descriptor)
    client.put_manifest(repo, tag, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)
    return Referred(descriptor["digest"], f"tag {tag}", False)


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


def fetch(client: RegistryClient, image: RemoteImage) -> list[FetchedEnvelope]:
    """Every DSSE envelope referring to the image, through the API or the fallback tag. A listed
    manifest whose subject is another image is not ours to read (an index anyone could push)."""
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
        out.append(FetchedEnvelope(f"{image.reference.registry}/{repo} referrer {d['digest']} ({via})", env))
    return out


def attach_and_refer(
    client: RegistryClient, ref: Reference, envelope: dsse.Envelope
) -> tuple[Attached, Referred]:
    """Both places admission controllers look: the `.att` tag (attach.attach, which checks the
    subject) and a referrer of the same manifest digest (pinned: a moved tag cannot split them)."""
    done = attach.attach(client, ref, envelope)
    image = attach.resolve(client, attach.parse_image(done.reference))
    return done, refer(client, image, envelope)


def attach_file(path: Path, image: str, *, insecure: bool = False) -> tuple[Attached, Referred]:
    """Attach the attestation in `path` (any form `verify` reads) to `image` in its registry."""
    envelopes = read_envelopes(path)
    if len(envelopes) != 1:
        raise UsageError(f"attestation {path}: holds {len(envelopes)} envelopes; attach one at a time")
    ref = attach.parse_image(image)
    with attach.client_for(ref, insecure=insecure) as client:
        return attach_and_refer(client, ref, envelopes[0])


def fetch_all(client: RegistryClient, image: RemoteImage) -> list[FetchedEnvelope]:
    """The `.att` tag's envelopes, then the referrers'."""
    return attach.fetch(client, image) + fetch(client, image)
