"""Attestations as OCI 1.1 referrers, beside the cosign `.att` tag, in the form cosign v3 writes
them, read back as cosign and Kyverno read them; every answer untrusted and bounded. Why each
field is as it is: docs/attestations.md, "How the referrers are written and read"."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagegate._support.jsontypes import JsonMapping, freeze_object
from imagegate.attest import attach, bundle, dsse
from imagegate.attest.attach import (
    DSSE_LAYER_MEDIA_TYPE,
    MAX_ATTESTATIONS,
    MAX_ENVELOPE_BYTES,
    Attached,
    FetchedEnvelope,
    Flooded,
    ReadBudget,
    RemoteImage,
    statement_of,
)
from imagegate.attest.envelopes import bundle_material, read_envelopes
from imagegate.attest.keys import PublicKey
from imagegate.attest.replace import (
    Decision,
    Kept,
    Replaced,
    Signed,
    locked,
    refuse_if_newer,
    verified,
)
from imagegate.domain.digest import digest_of, is_digest, split_digest
from imagegate.errors import NotVerified, UsageError
from imagegate.oci import untrusted_json
from imagegate.oci.manifest import OCI_INDEX, OCI_MANIFEST
from imagegate.oci.reference import Reference
from imagegate.oci.registry import NotFound, ReferrersPage, RegistryClient, RegistryError

if TYPE_CHECKING:
    from imagegate.attest import sign
    from imagegate.attest.keyless import Expected  # typing only: sigstore is an extra
    from imagegate.attest.keys import SigningKey

ARTIFACT_TYPE = bundle.BUNDLE_MEDIA_TYPE  # what is written
BUNDLE_TYPES = "application/vnd.dev.sigstore.bundle"  # any bundle version, as cosign and Kyverno match
LEGACY_ARTIFACT_TYPE = DSSE_LAYER_MEDIA_TYPE  # what imagegate wrote before: read and replaced
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_TYPE_ANNOTATION = "dev.sigstore.bundle.predicateType"
CREATED_ANNOTATION = "org.opencontainers.image.created"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
API = "the referrers API"  # where a registry indexes referrers itself
# A registry may page the API's listing, as it pages tags. The pages read for one image: 64 hold
# the MAX_ATTESTATIONS at 4 a page (at 10 a page, the size the ORAS referrers draft suggested, 26).
MAX_REFERRER_PAGES = 64


@dataclass(frozen=True)
class Referred:
    manifest_digest: str  # of the artifact manifest
    via: str  # "the referrers API" or "tag sha256-<hex>" (the fallback index)
    already: bool  # it was listed there already
    replaced: tuple[Replaced, ...] = ()  # earlier referrers deleted or unlisted
    # Earlier referrers it replaces that are still listed: the registry refused to delete them.
    remaining: tuple[Replaced, ...] = ()
    kept: tuple[Kept, ...] = ()  # earlier statements of its type left listed, and why


@dataclass(frozen=True)
class _Found:
    """A referrer read as an attestation."""

    descriptor: dict[str, Any]  # its entry in the referrers index
    via: str
    envelope: dsse.Envelope
    layer_digest: str
    is_bundle: bool  # the Sigstore bundle form (else imagegate's earlier bare envelope)
    material: dict[str, Any] | None = None  # the bundle's verificationMaterial

    @property
    def digest(self) -> str:
        return str(self.descriptor["digest"])


def fallback_tag(digest: str) -> str:
    algo, hexd = split_digest(digest)
    return f"{algo}-{hexd}"


def _go_json(obj: Any) -> bytes:
    """The bytes Go's json.Marshal gives for `obj`, whose keys the caller put in the Go struct's
    field order (maps sorted): compact, non-ASCII as is, and the characters Go escapes for
    HTML and JavaScript (`<`, `>`, `&`, U+2028, U+2029) escaped. They occur only in strings."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text.encode()


def _subject(client: RegistryClient, repo: str, digest: str) -> dict[str, Any]:
    found = client.head_manifest(repo, digest)
    if found is None:
        raise UsageError(f"{repo}@{digest}: not found in the registry", hint="push the image first")
    _, media_type, size = found
    return {"mediaType": media_type.split(";")[0].strip(), "size": size, "digest": digest}


def bundle_annotations(predicate_type: str, created: datetime) -> dict[str, str]:
    """cosign's annotations of a bundle referrer, keys sorted as Go writes a map."""
    return {
        CONTENT_ANNOTATION: "dsse-envelope",
        PREDICATE_TYPE_ANNOTATION: predicate_type,
        CREATED_ANNOTATION: created.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def artifact_manifest(subject: dict[str, Any], layer: bytes, notes: dict[str, str]) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": EMPTY_MEDIA_TYPE,
            "size": len(EMPTY),
            "digest": _EMPTY_DIGEST,
            "artifactType": ARTIFACT_TYPE,
        },
        "layers": [{"mediaType": ARTIFACT_TYPE, "size": len(layer), "digest": digest_of(layer)}],
        "annotations": dict(sorted(notes.items())),
        "subject": subject,
        "artifactType": ARTIFACT_TYPE,
    }
    return _go_json(manifest)


_EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def bundle_layer(envelope: dsse.Envelope, material: dict[str, Any]) -> bytes:
    """The referrer's layer: the Sigstore bundle, compact, as protojson writes it."""
    return json.dumps(bundle.wrap(envelope, material), separators=(",", ":")).encode()


def judged(client: RegistryClient, image: RemoteImage, new: Signed) -> list[tuple[_Found, Decision | None]]:
    """The image's referrers, each with what `new` does to it (attest/replace.py; nothing written)."""
    return [
        (f, attach.judge(new, f.envelope, image, f"referrer {f.digest}", f.material))
        for f in _referred(client, image)
    ]


def refer(client: RegistryClient, image: RemoteImage, new: Signed, material: dict[str, Any]) -> Referred:
    """Push `new` as a referrer of `image` (whose subject the caller has checked), a Sigstore
    bundle with `material` naming the key, then remove the earlier referrers it supersedes
    (attest/replace.py): unlisted from the fallback index, deleted where the registry indexes
    them itself. The same statement already there is not pushed again (its `created` would
    differ); one of the same signer and pipeline said later refuses it (NewerThere)."""
    found = judged(client, image, new)
    decisions = [d for _, d in found if d is not None]
    refuse_if_newer(new, decisions, "the attestation")
    layer = bundle_layer(new.envelope, material)
    same = next(
        (f for f, d in found if f.is_bundle and (f.layer_digest == digest_of(layer) or _same(d))), None
    )
    stale = {f.digest: d.entry for f, d in found if d is not None and d.action == "replace"}
    kept = tuple(Kept(d.entry, d.why) for d in decisions if d.action == "keep")
    if same is not None:
        digest, indexed, descriptor = same.digest, same.via == API, same.descriptor
    else:
        digest, indexed, descriptor = _push_referrer(client, image, new, layer)
    repo = image.reference.repository
    if indexed:
        # Pushed first, deleted after: a reader in between sees both, never neither.
        refused = [gone for d, gone in stale.items() if not client.delete_manifest(repo, d)]
        done = tuple(gone for gone in stale.values() if gone not in refused)
        return Referred(digest, API, same is not None, done, tuple(refused), kept)
    referred = _add_to_fallback(client, repo, image.digests[0], descriptor, set(stale))
    for d in stale:
        # Unlisted is enough for a reader of the fallback tag; the manifest itself is removed
        # where the registry allows it, and left, unread, where it does not.
        client.delete_manifest(repo, d)
    return Referred(referred.manifest_digest, referred.via, referred.already, tuple(stale.values()), (), kept)


def _same(decision: Decision | None) -> bool:
    return decision is not None and decision.action == "same"


def _push_referrer(
    client: RegistryClient, image: RemoteImage, new: Signed, layer: bytes
) -> tuple[str, bool, dict[str, Any]]:
    """Push the bundle `layer` as a referrer manifest; its digest, whether the registry indexes
    it itself, and its descriptor for a fallback index."""
    repo = image.reference.repository
    notes = bundle_annotations(str(new.statement.get("predicateType", "")), datetime.now(timezone.utc))
    client.upload_blob(repo, EMPTY, _EMPTY_DIGEST)
    client.upload_blob(repo, layer)
    raw = artifact_manifest(_subject(client, repo, image.digests[0]), layer, notes)
    digest, indexed = client.put_referrer(repo, raw, OCI_MANIFEST)
    # go-containerregistry's descriptor field order; the annotations copied, as the
    # distribution spec says a client keeping the fallback index does.
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "size": len(raw),
        "digest": digest,
        "annotations": notes,
        "artifactType": ARTIFACT_TYPE,
    }
    return digest, indexed, descriptor


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
    # Sorted by digest, as go-containerregistry (cosign's writer) keeps the fallback index.
    entries = listed if already else [*listed, descriptor]
    index["manifests"] = sorted(entries, key=lambda d: str(d.get("digest")) if isinstance(d, dict) else "")
    client.put_manifest(repo, tag, _go_json(index), OCI_INDEX)
    return Referred(descriptor["digest"], f"tag {tag}", already)


def _readable(artifact_type: object) -> bool:
    """An artifact type read here: a Sigstore bundle of any version, or imagegate's earlier form."""
    return isinstance(artifact_type, str) and (
        artifact_type.startswith(BUNDLE_TYPES) or artifact_type == LEGACY_ARTIFACT_TYPE
    )


def _listed(client: RegistryClient, repo: str, digest: str) -> tuple[list[dict[str, Any]], str]:
    """The referrers listed for `digest` whose type is read here, and where: every page the API
    lists, else the fallback tag (one index)."""
    page = client.referrers(repo, digest)
    if page is not None:
        return _paged(client, repo, digest, page), API
    via = f"tag {fallback_tag(digest)}"
    try:
        raw = client.get_manifest(repo, fallback_tag(digest), accept=(OCI_INDEX,)).raw
    except NotFound:
        return [], via
    return _entries(raw, repo, digest, via), via


def _paged(client: RegistryClient, repo: str, digest: str, first: ReferrersPage) -> list[dict[str, Any]]:
    """The entries of `first` and of every page its `next` links lead to, merged in order. Past
    MAX_REFERRER_PAGES pages, or MAX_ATTESTATIONS entries read here, Flooded: never a partial
    list, since the statement that refuses may be on the page left unread."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    page: ReferrersPage | None = first
    while page is not None:
        seen.add(page.url)
        out += _entries(page.raw, repo, digest, API)
        if len(out) > MAX_ATTESTATIONS:
            raise _flooded(
                client,
                repo,
                digest,
                f"the referrers ({API}) list more than the {MAX_ATTESTATIONS} attestations read "
                f"for one image, by page {len(seen)}",
            )
        page = _next_page(client, repo, digest, page, seen)
    return out


def _next_page(
    client: RegistryClient, repo: str, digest: str, page: ReferrersPage, seen: set[str]
) -> ReferrersPage | None:
    """The page after `page`, unless it is the last; one read already (a cycle) is refused."""
    if page.next is None:
        return None
    if page.next in seen:
        raise RegistryError(
            f"{client.registry}/{repo}: the referrers of {digest} ({API}) link page {len(seen)} "
            f"back to {page.next}, read already: a cycle, not followed",
            hint="the registry is misconfigured or hostile; ask its operator",
        )
    if len(seen) >= MAX_REFERRER_PAGES:
        raise _flooded(
            client, repo, digest, f"the referrers ({API}) run past the {MAX_REFERRER_PAGES} pages read"
        )
    return client.referrers(repo, digest, page.next)


def _flooded(client: RegistryClient, repo: str, digest: str, what: str) -> Flooded:
    return ReadBudget(f"{client.registry}/{repo}@{digest}").flooded(what)


def _entries(raw: bytes, repo: str, digest: str, via: str) -> list[dict[str, Any]]:
    """A referrers index's entries whose type is read here."""
    try:
        index = untrusted_json.loads(raw)
    except untrusted_json.UntrustedJSONError as e:
        raise RegistryError(f"{repo}: the referrers of {digest} ({via}) are {e}") from e
    listed = index.get("manifests") if isinstance(index, dict) else None
    return [
        d
        for d in (listed if isinstance(listed, list) else [])
        if isinstance(d, dict) and _readable(d.get("artifactType")) and is_digest(str(d.get("digest")))
    ]


def _envelope(
    client: RegistryClient, repo: str, layer: dict[str, Any], budget: ReadBudget
) -> tuple[dsse.Envelope, dict[str, Any] | None] | None:
    """The DSSE envelope a referrer's one layer holds, and its Sigstore bundle's
    verificationMaterial ({} for a bundle without one; None: a bare envelope); None for
    a layer that is neither (a message-signature bundle signs a blob: another tool's), or one too
    large or not what its digest says (read_blob's cap and check)."""
    media_type, digest = str(layer.get("mediaType")), str(layer.get("digest"))
    if not is_digest(digest) or not (
        media_type.startswith(BUNDLE_TYPES) or media_type == DSSE_LAYER_MEDIA_TYPE
    ):
        return None
    try:
        data = budget.blob(client, repo, digest)
        if media_type == DSSE_LAYER_MEDIA_TYPE:
            return dsse.from_json(data), None
        obj = untrusted_json.loads(data, max_bytes=MAX_ENVELOPE_BYTES)
        if not bundle.is_bundle(obj):
            return None
        return bundle.envelope_of(obj), dict(bundle.material_of(obj) or {})
    except (UsageError, RegistryError, untrusted_json.UntrustedJSONError):
        return None


def _referred(client: RegistryClient, image: RemoteImage, budget: ReadBudget | None = None) -> list[_Found]:
    """Every DSSE envelope referring to the image, in either form, within `budget` (a fresh one
    for the image when none is given). A listed manifest whose subject is another image is not
    ours to read (an index anyone could push)."""
    repo, digest = image.reference.repository, image.digests[0]
    budget = budget or ReadBudget(f"{image.reference.registry}/{repo}@{digest}")
    descriptors, via = _listed(client, repo, digest)
    budget.listing(len(descriptors), f"the referrers ({via})")
    out = []
    for d in descriptors:
        try:
            raw = client.get_manifest(repo, d["digest"], accept=(OCI_MANIFEST,)).raw
            budget.took(len(raw))
            manifest = untrusted_json.loads(raw)
        except (NotFound, untrusted_json.UntrustedJSONError):
            continue
        if not isinstance(manifest, dict) or (manifest.get("subject") or {}).get("digest") != digest:
            continue
        layers = [x for x in manifest.get("layers") or [] if isinstance(x, dict)]
        read = _envelope(client, repo, layers[0], budget) if len(layers) == 1 else None
        if read is not None:
            envelope, material = read
            out.append(_Found(d, via, envelope, str(layers[0]["digest"]), material is not None, material))
    return out


def fetch(
    client: RegistryClient, image: RemoteImage, budget: ReadBudget | None = None
) -> list[FetchedEnvelope]:
    """Every DSSE envelope referring to the image, through the API or the fallback tag."""
    where = f"{image.reference.registry}/{image.reference.repository}"
    return [
        FetchedEnvelope(f"{where} referrer {f.digest} ({f.via})", f.envelope, f.material)
        for f in _referred(client, image, budget)
    ]


# keyless.KeylessKey.stamp: an `.att` layer's bytes and bundle material -> cosign's annotations
Stamp = Callable[[bytes, JsonMapping], "dict[str, str] | None"]


def attach_and_refer(
    client: RegistryClient,
    ref: Reference,
    todo: Sequence[tuple[dsse.Envelope, dict[str, Any]]],
    trusted: Sequence[PublicKey],
    source: str = "the attestation",
    keyless: Expected | None = None,
    stamp: Stamp | None = None,
) -> list[tuple[Attached | None, Referred]]:
    """Both places admission controllers look, for each envelope of `todo` (an acceptance and the
    statements signed beside it, each with the `material` naming its key): the `.att` tag
    (cosign's legacy form, read by policy-controller's authorities and Kyverno's default
    verifier) and a referrer of the same manifest digest in cosign v3's bundle form. The tag is
    resolved once (a moved tag cannot split them); each envelope must verify with `trusted`
    (NotVerified) and none may be older than its signer's word there (NewerThere): both checked
    for all before anything is written. Read, changed and written back under the image's lock.

    `keyless`: each envelope's bundle must prove that identity (its certificate, log entry and
    timestamps, against the trusted root). Its `.att` layer is written only with the proof cosign's
    classic form takes without a Rekor v1 entry, which `stamp` makes (the certificate and a
    timestamp over the layer: keyless.KeylessKey.stamp), the bundle material beside them for
    later readers; without one, None in the pair's place of the tag."""
    if keyless is None:
        news = [(verified(env, trusted, source), material) for env, material in todo]
    else:
        news = [(keyless_verified(env, material, keyless, source), material) for env, material in todo]
    # asked before the lock: a timestamp authority's answer is a network wait
    proofs = [_proof(new, material, stamp) if keyless else {} for new, material in news]
    image = attach.resolve(client, ref)
    with locked(str(image.reference)):
        for new, _ in news:
            attach.check_subject(image, ref, new.statement)
            refuse_if_newer(new, attach.read_layers(client, image, new).decisions(), source)
            refuse_if_newer(new, [d for _, d in judged(client, image, new) if d is not None], source)
        return [
            (
                None if proof is None else attach.attach(client, image, new, proof),
                refer(client, image, new, material),
            )
            for (new, material), proof in zip(news, proofs, strict=True)
        ]


def _proof(new: Signed, material: JsonMapping, stamp: Stamp | None) -> dict[str, str] | None:
    """A keyless `.att` layer's annotations: `stamp`'s (None: no `.att` layer) and the material."""
    made = stamp(attach.layer_bytes(new.envelope), material) if stamp is not None else None
    if made is None:
        return None
    return {**made, attach.MATERIAL_ANNOTATION: json.dumps(material, separators=(",", ":"))}


def attach_signed(
    client: RegistryClient, ref: Reference, signed: sign.Signed, key: SigningKey | None
) -> list[tuple[Attached | None, Referred]]:
    """A signed attempt's statements (a run's acceptance or an index statement, then the VSA and
    the test-result), each with its own bundle's material, attached as `attach_and_refer` does:
    verified with the signing key, or keyless for the identity its certificate names, the
    `.att` layers with the proof `key` stamps."""
    from imagegate.attest import keyless

    todo = list(zip((signed.envelope, *signed.standard), signed.materials, strict=True))
    trusted = (signed.public,) if signed.public is not None else ()
    if isinstance(key, keyless.KeylessKey):
        return attach_and_refer(client, ref, todo, trusted, str(signed.dsse_path), key.expected(), key.stamp)
    return attach_and_refer(client, ref, todo, trusted, str(signed.dsse_path))


def keyless_verified(
    envelope: dsse.Envelope, material: dict[str, Any], expected: Expected, source: str
) -> Signed:
    """The new statement, its bundle proving `expected` (NotVerified otherwise, nothing
    written); the signer whose earlier word it supersedes is that identity: an earlier bundle
    that proves it too."""
    key, said = expected.verified_key(
        bundle.wrap(envelope, material), envelope.payload_type, envelope.payload
    )
    if key is None:
        raise NotVerified(f"{source}: its bundle does not prove {expected}: {said}; nothing attached")

    def proves(old: dsse.Envelope, old_material: JsonMapping | None) -> bool:
        if not old_material:  # a bare envelope, or a bundle with no certificate: not this identity's
            return False
        proof = bundle.wrap(old, freeze_object(old_material))
        return expected.verified_key(proof, old.payload_type, old.payload)[0] is not None

    # The statement's form checked as for a key (the certificate's key signed it: proven above).
    return replace(verified(envelope, [key], source), proves=proves, who=f"identity {expected}")


def attach_file(
    path: Path, image: str, trusted: Sequence[PublicKey], *, insecure: bool = False
) -> list[tuple[Attached | None, Referred]]:
    """Attach the attestation in `path` (any form `verify` reads) to `image` in its registry; an
    attempt's acceptance brings the VSA and test-result signed beside it (`standard_beside`).
    Each referrer is a Sigstore bundle, whose verificationMaterial comes from the bundle that
    holds the envelope (`path` itself, or the `.sigstore.json` signing wrote beside it). Every
    envelope must verify with `trusted`, else nothing is written."""
    envelopes = read_envelopes(path)
    if len(envelopes) != 1:
        raise UsageError(f"attestation {path}: holds {len(envelopes)} envelopes; attach one at a time")
    ref = attach.parse_image(image)
    # Every key named before anything is pushed: a half-attached attempt helps no one.
    todo = [(env, _material(p, env)) for p, env in ((path, envelopes[0]), *_beside(path, envelopes[0]))]
    with attach.client_for(ref, insecure=insecure) as client:
        return attach_and_refer(client, ref, todo, trusted, str(path))


def _material(path: Path, envelope: dsse.Envelope) -> dict[str, Any]:
    material = bundle_material(path, envelope)
    if material is None:
        stem = path.name.split(".")[0]
        raise UsageError(
            f"attestation {path}: no Sigstore bundle holds it, and the referrer cosign reads is a "
            "Sigstore bundle, which names the signing key",
            hint=f"attach {stem}.sigstore.json, or keep it beside {path.name} (imagegate signs both)",
        )
    return material


def standard_beside(path: Path, envelope: dsse.Envelope) -> list[dsse.Envelope]:
    """The VSA and test-result in the attempt folder holding the acceptance `path`, when they are
    about the same subject and pipeline: attached with it, as `run --attach` does, so that the
    statements a controller reads say the same verdict. None for any other attestation."""
    return [env for _, env in _beside(path, envelope)]


def _beside(path: Path, envelope: dsse.Envelope) -> list[tuple[Path, dsse.Envelope]]:
    """`standard_beside`, with the file each was read from."""
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
            out.append((path.parent / name, env))
    return out


def fetch_all(client: RegistryClient, image: RemoteImage) -> list[FetchedEnvelope]:
    """The `.att` tag's envelopes, then the referrers', within one budget for the image: over it,
    Flooded (exit 1), never a partial list."""
    budget = ReadBudget(f"{image.reference.registry}/{image.reference.repository}@{image.digests[0]}")
    return attach.fetch(client, image, budget) + fetch(client, image, budget)


# -- what an attach did, in words (the CLI and the use cases' callers say it) --------------


def kept(pairs: Sequence[tuple[Attached | None, Referred]]) -> list[str]:
    """Each earlier statement of a new one's type that an attach left there, and why."""
    return [k.describe() for done, referred in pairs for k in (*(done.kept if done else ()), *referred.kept)]


REPLACED_KEPT = (
    "the replaced statements are no longer attached; they stay in the attempt folders that signed "
    "them (the registry held only their envelopes)"
)


def remaining(pairs: Sequence[tuple[Attached | None, Referred]], repository: str) -> str | None:
    """What an attach leaves that it should have replaced (a registry that refuses deletion), as
    the message that goes with exit 1; None when nothing is left."""
    left = [gone for _, referred in pairs for gone in referred.remaining]
    if not left:
        return None
    named = ", ".join(gone.describe() for gone in left)
    return (
        f"the registry refused to delete {len(left)} earlier statement(s) the new ones replace: {named}; "
        "admission controllers still read them\n"
        "  hint: enable deletion in the registry (distribution: storage.delete.enabled: true) and attach "
        f"again, or delete them by hand (DELETE /v2/{repository}/manifests/DIGEST)"
    )
