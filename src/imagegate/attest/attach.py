"""Attestations in the registry, stored the way cosign stores key-signed attestations
(`cosign attest --key`), so that cosign, Kyverno and sigstore policy-controller find them:
an image manifest tagged `sha256-<hex>.att` in the image's repository, one layer per DSSE
envelope (media type `application/vnd.dsse.envelope.v1+json`, annotations
`dev.cosignproject.cosign/signature: ""` and `predicateType`), added to what is already there;
an earlier imagegate statement of the same predicate type and pipeline is dropped, as
`cosign attest --replace` drops earlier layers of the new one's type (attest/replace.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from imagegate._support import jsontypes
from imagegate.attest import dsse
from imagegate.attest.replace import Decision, Kept, Replaced, Signed, decide, refuse_if_newer, subjects_of
from imagegate.domain.digest import digest_of, is_digest, split_digest
from imagegate.errors import NotVerified, UsageError
from imagegate.oci import engineapi, untrusted_json
from imagegate.oci.errors import BlobNotFound
from imagegate.oci.manifest import (
    DOCKER_MANIFEST,
    INDEX_TYPES,
    MANIFEST_TYPES,
    OCI_CONFIG,
    OCI_MANIFEST,
    ManifestError,
)
from imagegate.oci.reference import Reference, parse_reference
from imagegate.oci.registry import NotFound, RegistryClient, RegistryError

DSSE_LAYER_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
GONE = "its blob is gone from the registry (no reader can read it, and the registry refuses a manifest that names it)"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"  # empty for attestations: the signature is inside
PREDICATE_TYPE_ANNOTATION = "predicateType"  # what cosign writes and filters on
INTOTO_PREDICATE_TYPE_ANNOTATION = "in-toto.io/predicate-type"  # what other scanners filter on
# A keyless layer's Sigstore bundle verificationMaterial (certificate, log entry, timestamps over
# the signature): the proof of its signer that `verify` and a later attach read; cosign's own
# annotations beside it (certificate, a timestamp over the layer) are what policy-controller reads.
MATERIAL_ANNOTATION = "dev.imagegate/verification-material"
MAX_ENVELOPE_BYTES = 16 << 20  # an attestation layer is a JSON document; refuse anything larger
MAX_PLATFORMS_NAMED = 16  # an index's platforms named in a message: bounded, however many it lists
# What is read for one image, its `.att` tag and its referrers together (a registry may list any
# number): a run attaches three statements, replacing its earlier ones; other tools add a few.
MAX_ATTESTATIONS = 256
MAX_ATTESTATION_BYTES_READ = 64 << 20  # every envelope, bundle and referrer manifest read


class Flooded(NotVerified):
    """More attestations, or more bytes of them, than one image's read allows: nothing is
    verified (a partial read could miss the statement that refuses)."""


class BlobTooLarge(RegistryError):
    """A blob larger than the bytes it may have."""


@dataclass
class ReadBudget:
    """The attestations read for one image so far: counted before each read, each read capped at
    what is left, so memory stays bounded whatever a registry lists."""

    where: str
    count: int = 0
    total: int = 0

    def flooded(self, what: str) -> Flooded:
        return Flooded(
            f"{self.where}: {what}; nothing verified",
            hint="remove the attestations no one reads any more (imagegate attach replaces its own "
            "earlier ones), or verify an attestation file: imagegate verify FILE --image IMAGE",
        )

    def listing(self, n: int, where: str) -> None:
        """A listing of `n` attestations (an `.att` manifest's layers, a referrers index)."""
        if n > MAX_ATTESTATIONS:
            raise self.flooded(
                f"{where} lists {n} attestations, more than the {MAX_ATTESTATIONS} read for one image"
            )

    def too_many_bytes(self) -> Flooded:
        return self.flooded(f"more than {MAX_ATTESTATION_BYTES_READ >> 20} MiB of attestations")

    def took(self, size: int) -> None:
        self.total += size
        if self.total > MAX_ATTESTATION_BYTES_READ:
            raise self.too_many_bytes()

    def blob(self, client: RegistryClient, repo: str, digest: str) -> bytes:
        if self.count >= MAX_ATTESTATIONS:
            raise self.flooded(f"more than the {MAX_ATTESTATIONS} attestations read for one image")
        left = MAX_ATTESTATION_BYTES_READ - self.total
        try:
            data = read_blob(client, repo, digest, min(MAX_ENVELOPE_BYTES, left))
        except BlobTooLarge:
            if left < MAX_ENVELOPE_BYTES:
                raise self.too_many_bytes() from None
            raise
        self.count += 1
        self.took(len(data))
        return data


@dataclass(frozen=True)
class Attached:
    reference: str  # repository@digest of the image
    tag: str  # sha256-<hex>.att
    manifest_digest: str  # of the new .att manifest
    layer_digest: str
    layers: int  # in the .att manifest now
    already: bool  # the same envelope was there: nothing pushed
    replaced: tuple[Replaced, ...] = ()  # the earlier layers dropped from the .att manifest
    kept: tuple[Kept, ...] = ()  # earlier statements of its type left there, and why
    dropped: tuple[str, ...] = ()  # layers no reader can read (their blob gone), and why


@dataclass(frozen=True)
class RemoteImage:
    reference: Reference  # pinned: .digest is set
    digests: tuple[str, ...]  # manifest digest, then the config digest when there is one
    # Where the reference names an index: each platform's manifest ("os/arch" -> digest), from
    # the same bytes that were read (an index is no image that ran).
    platforms: tuple[tuple[str, str], ...] = ()

    @property
    def subject_digests(self) -> tuple[str, ...]:
        """The digests an attestation's subject may name for this image in its registry: its
        manifest digest only, the one cosign and admission controllers match the subject with
        (a config digest names the content, not what they check)."""
        return self.digests[:1]


subject_digests = subjects_of  # a statement's subject digests as `algorithm:hex`


def matching_subject(subjects: Sequence[str], image_digests: Sequence[str]) -> str | None:
    """The first of the image's digests that the statement's subject names, or None: the one
    rule `attach` and `verify --image` both apply, so they accept the same attestations."""
    return next((d for d in image_digests if d in subjects), None)


@dataclass(frozen=True)
class FetchedEnvelope:
    source: str  # REPO:TAG layer N
    envelope: dsse.Envelope
    material: dict[str, Any] | None = None  # a referrer bundle's verificationMaterial


def parse_image(text: str) -> Reference:
    return parse_reference(text.removeprefix("docker://"))


def names_a_registry(text: str) -> bool:
    """Whether `text` names its registry host; a bare `repo:tag` means Docker Hub to a registry
    client but is, far more often, an image in the local engine."""
    first, sep, _ = text.removeprefix("docker://").partition("/")
    return text.startswith("docker://") or (
        bool(sep) and ("." in first or ":" in first or first == "localhost")
    )


@dataclass(frozen=True)
class EngineImage:
    name: str
    image_id: str  # the config digest
    repo_digests: tuple[str, ...]  # manifest digests of the registries it was pulled from or pushed to

    def pushed_as(self, ref: Reference) -> bool:
        """Whether the engine knows this image from `ref`'s repository in its registry (pulled
        from or pushed to it); otherwise that registry cannot hold its attestations."""
        for rd in self.repo_digests:
            try:
                known = parse_reference(rd)
            except UsageError:
                continue
            if (known.registry, known.repository) == (ref.registry, ref.repository):
                return True
        return False

    @property
    def digests(self) -> tuple[str, ...]:
        """Every digest naming this image: its ID (a statement made before any push names it)
        and the manifest digests it carries from registries."""
        return (self.image_id, *dict.fromkeys(d.partition("@")[2] for d in self.repo_digests))

    def ran_manifest(self, *, insecure: bool = False) -> str | None:
        """The manifest whose config is this image (a repo digest may name an index, which is no
        statement's subject: oci.ran); None when no registry shows one."""
        from imagegate.oci.ran import ran_manifest

        return ran_manifest(
            self.repo_digests, self.image_id, named=self.name, insecure=insecure
        ).manifest_digest


def engine_image(text: str) -> EngineImage | None:
    """The image a bare name (no registry host) names in the local engine (DOCKER_HOST), or None
    when the name has a registry host, the engine lacks it or no engine answers."""
    if names_a_registry(text):
        return None
    try:
        client = engineapi.connect(None, timeout=10)
        try:
            attrs = engineapi.inspect_image(client, text)
        finally:
            client.close()
    except Exception:  # no engine, no such image, a refused name: not a local image, then
        return None
    image_id = str(attrs.get("Id", ""))
    if not image_id.startswith("sha256:"):
        image_id = "sha256:" + image_id
    return EngineImage(text, image_id, tuple(str(d) for d in attrs.get("RepoDigests") or ()))


def not_found_anywhere(text: str, err: RegistryError) -> UsageError:
    """A bare name that neither the local engine nor Docker Hub answered for: the user most
    likely meant a local image, so say that first; one input error, as for any missing image."""
    return UsageError(
        f"image {text}: not found in the local engine, and the registry could not be asked ({err})",
        hint="check the name (docker images lists the engine's); a registry image needs its host, "
        "e.g. registry.example/team/app:1",
    )


def client_for(ref: Reference, *, insecure: bool = False) -> RegistryClient:
    return RegistryClient(ref.endpoint, insecure=insecure)


def attestation_tag(digest: str) -> str:
    algo, hexd = split_digest(digest)
    return f"{algo}-{hexd}.att"


def resolve(client: RegistryClient, ref: Reference) -> RemoteImage:
    """The digest `ref` names now (a tag is resolved once: later steps use the digest, as cosign
    does, so a tag moved mid-way cannot mix two images), and its config digest if it is an
    image manifest (for statements made before the image was pushed)."""
    try:
        top = client.get_manifest(ref.repository, ref.ref)
    except NotFound as e:
        raise UsageError(f"image {ref}: not found in the registry", hint="push it first") from e
    digests = [top.digest]
    if top.media_type in MANIFEST_TYPES:
        try:
            config = jsontypes.path(untrusted_json.loads(top.raw), "config", "digest")
        except untrusted_json.UntrustedJSONError:
            config = None
        if isinstance(config, str) and is_digest(config):
            digests.append(config)
    platforms: tuple[tuple[str, str], ...] = ()
    if top.media_type in INDEX_TYPES:
        from imagegate.attest.platforms import list_platforms

        with contextlib.suppress(UsageError, ManifestError):  # no platforms to name, then
            listed = list_platforms(top.raw, top.media_type, str(ref)).platforms
            platforms = tuple((p.platform, p.digest) for p in listed)[:MAX_PLATFORMS_NAMED]
    return RemoteImage(ref.with_digest(top.digest), tuple(digests), platforms)


def _existing(client: RegistryClient, repo: str, tag: str) -> dict[str, Any] | None:
    try:
        found = client.get_manifest(repo, tag, accept=(OCI_MANIFEST, DOCKER_MANIFEST))
    except NotFound:
        return None
    try:
        doc = untrusted_json.loads(found.raw)
    except untrusted_json.UntrustedJSONError as e:
        raise RegistryError(f"{repo}:{tag}: the existing attestation manifest is {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise RegistryError(f"{repo}:{tag}: the existing attestation manifest has no layers list")
    return doc


def read_blob(client: RegistryClient, repo: str, digest: str, limit: int = MAX_ENVELOPE_BYTES) -> bytes:
    chunks, total = [], 0
    with client.open_blob(repo, digest) as stream:
        while chunk := stream.read(1 << 20):
            total += len(chunk)
            if total > limit:
                raise BlobTooLarge(f"{repo}: blob {digest} is larger than {limit} bytes; not an attestation")
            chunks.append(chunk)
    data = b"".join(chunks)
    if digest_of(data, digest.partition(":")[0]) != digest:
        raise RegistryError(f"{repo}: blob {digest} does not hash to its digest")
    return data


def _config(client: RegistryClient, repo: str, old: dict[str, Any] | None, diff_ids: list[str]) -> bytes:
    """The .att image's config, as go-containerregistry's `mutate.Append` keeps it: the earlier
    config (if readable) with every layer's diff ID (the layers are not compressed: diff ID =
    digest) and one empty history entry per layer."""
    cfg: dict[str, Any] = {
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "os": "",
        "config": {},
    }
    desc = (old or {}).get("config") or {}
    if old and isinstance(desc.get("digest"), str):
        try:
            loaded = untrusted_json.loads(read_blob(client, repo, desc["digest"]))
            if isinstance(loaded, dict):
                cfg = loaded
        except (RegistryError, untrusted_json.UntrustedJSONError):
            pass  # an unreadable earlier config is rebuilt; the layers are what matters
    history = list(cfg.get("history") or [])
    history += [{"created": "0001-01-01T00:00:00Z"}] * (len(diff_ids) - len(history))
    cfg["history"] = history[: len(diff_ids)]
    cfg["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return json.dumps(cfg, separators=(",", ":")).encode()


def check_subject(image: RemoteImage, ref: Reference, statement: Mapping[str, Any]) -> None:
    """UsageError unless the statement is about `image`'s manifest digest."""
    subjects = subject_digests(statement)
    if matching_subject(subjects, image.subject_digests) is None:
        raise UsageError(
            f"attestation subject {', '.join(subjects) or '(none)'} is not {ref} ({image.digests[0]})",
            hint="attach an attestation to the image it was made for (run it on the pushed image, "
            "or push the image that was run)",
        )


@dataclass
class Layers:
    """The `.att` tag as read for one new statement: its manifest, and what the new statement
    does to each earlier layer (attest/replace.py `decide`), in listing order."""

    old: dict[str, Any] | None
    judged: list[tuple[Any, Decision | None]]

    def decisions(self) -> list[Decision]:
        return [d for _, d in self.judged if d is not None]


def read_layers(client: RegistryClient, image: RemoteImage, new: Signed) -> Layers:
    """Read the image's `.att` tag and judge each layer against `new` (nothing written)."""
    repo = image.reference.repository
    tag = attestation_tag(image.digests[0])
    old = _existing(client, repo, tag)
    budget = ReadBudget(f"{image.reference.registry}/{repo}:{tag}")
    budget.listing(len(old["layers"]) if old else 0, f"tag {tag}")
    judged = [(x, _judge(client, repo, x, new, image, budget)) for x in (old["layers"] if old else [])]
    return Layers(old, judged)


def layer_bytes(envelope: dsse.Envelope) -> bytes:
    """An `.att` layer: the envelope, compact, as cosign writes it."""
    return envelope.to_json(indent=None).rstrip(b"\n")


def attach(
    client: RegistryClient, image: RemoteImage, new: Signed, proof: Mapping[str, str] | None = None
) -> Attached:
    """Add `new` to the image's `.att` tag, dropping the earlier layers it supersedes; refused
    (NewerThere, nothing written) when the same signer already said something later. `proof`:
    a keyless layer's annotations (its certificate, timestamp and bundle material)."""
    check_subject(image, image.reference, new.statement)
    found = read_layers(client, image, new)
    refuse_if_newer(new, found.decisions(), "the attestation")
    repo, tag = image.reference.repository, attestation_tag(image.digests[0])
    layer = layer_bytes(new.envelope)
    layer_digest = digest_of(layer)
    layers = [x for x, d in found.judged if d is None or d.action not in ("replace", "gone")]
    replaced = tuple(d.entry for d in found.decisions() if d.action == "replace")
    kept = tuple(Kept(d.entry, d.why) for d in found.decisions() if d.action == "keep")
    dropped = tuple(f"{d.entry.where}: {d.why}" for d in found.decisions() if d.action == "gone")
    pinned = f"{image.reference.registry}/{repo}@{image.digests[0]}"
    there = any(d.action == "same" for d in found.decisions()) or any(
        isinstance(x, dict) and x.get("digest") == layer_digest for x in layers
    )
    if there and len(layers) == len(found.judged):
        return Attached(pinned, tag, "", layer_digest, len(layers), True, (), kept, dropped)
    if not there:
        client.upload_blob(repo, layer, layer_digest)
        predicate_type = str(new.statement.get("predicateType", ""))
        layers.append(_layer_descriptor(layer, layer_digest, predicate_type, proof))
    pushed = _put_tag(client, repo, tag, found.old, layers)
    return Attached(pinned, tag, pushed, layer_digest, len(layers), False, replaced, kept, dropped)


def append(client: RegistryClient, image: RemoteImage, envelope: dsse.Envelope) -> str:
    """Add `envelope` to the `.att` tag as it is, judging and checking nothing, as `cosign attest`
    without `--replace` appends: what another tool, or anyone with push rights, can put there
    (the tests put it there to show what every reader then makes of it)."""
    repo, tag = image.reference.repository, attestation_tag(image.digests[0])
    old = _existing(client, repo, tag)
    layer = layer_bytes(envelope)
    statement = statement_of(envelope)
    client.upload_blob(repo, layer, digest_of(layer))
    added = _layer_descriptor(layer, digest_of(layer), str(statement.get("predicateType", "")))
    return _put_tag(client, repo, tag, old, [*(old["layers"] if old else []), added])


def _layer_descriptor(
    layer: bytes, layer_digest: str, predicate_type: str, proof: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "mediaType": DSSE_LAYER_MEDIA_TYPE,
        "size": len(layer),
        "digest": layer_digest,
        "annotations": {
            SIGNATURE_ANNOTATION: "",
            PREDICATE_TYPE_ANNOTATION: predicate_type,
            INTOTO_PREDICATE_TYPE_ANNOTATION: predicate_type,
            **(proof or {}),
        },
    }


def layer_material(layer: Any) -> dict[str, Any] | None:
    """The bundle verificationMaterial a keyless `.att` layer carries in its annotations (None:
    none, or not a JSON object): untrusted, proven only by verifying it with its envelope."""
    notes = layer.get("annotations") if isinstance(layer, dict) else None
    said = notes.get(MATERIAL_ANNOTATION) if isinstance(notes, dict) else None
    if not isinstance(said, str):
        return None
    try:
        found = untrusted_json.loads(said.encode(), max_bytes=MAX_ENVELOPE_BYTES)
    except untrusted_json.UntrustedJSONError:
        return None
    return found if isinstance(found, dict) else None


def _put_tag(
    client: RegistryClient, repo: str, tag: str, old: dict[str, Any] | None, layers: list[dict[str, Any]]
) -> str:
    """Push the .att tag's new manifest: `layers`, with the earlier manifest's media types and
    annotations kept (another tool's manifest there stays its form)."""
    config = _config(client, repo, old, [str(x.get("digest")) for x in layers])
    config_digest = client.upload_blob(repo, config)
    media_type = str(old.get("mediaType") or OCI_MANIFEST) if old else OCI_MANIFEST
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {
            "mediaType": str(((old or {}).get("config") or {}).get("mediaType") or OCI_CONFIG),
            "size": len(config),
            "digest": config_digest,
        },
        "layers": layers,
    }
    if old and old.get("annotations"):
        manifest["annotations"] = old["annotations"]
    raw = json.dumps(manifest, separators=(",", ":")).encode()
    return client.put_manifest(repo, tag, raw, media_type)


def layer_envelope(client: RegistryClient, repo: str, layer: Any, budget: ReadBudget) -> dsse.Envelope | None:
    """The DSSE envelope an `.att` layer holds, or None for a layer that is not one (someone
    else's layer, not ours to judge)."""
    if not isinstance(layer, dict) or layer.get("mediaType") != DSSE_LAYER_MEDIA_TYPE:
        return None
    digest = layer.get("digest")
    if not isinstance(digest, str) or not is_digest(digest):
        return None
    data = budget.blob(client, repo, digest)
    try:
        return dsse.from_json(data)
    except UsageError:
        return None


def judge(
    new: Signed,
    envelope: dsse.Envelope | None,
    image: RemoteImage,
    where: str,
    material: Mapping[str, Any] | None = None,
) -> Decision | None:
    """What `new` does to an earlier `envelope` of `image` (attest/replace.py `decide`)."""
    return decide(new, envelope, image.digests[0], where, material)


def _judge(
    client: RegistryClient, repo: str, layer: Any, new: Signed, image: RemoteImage, budget: ReadBudget
) -> Decision | None:
    try:
        envelope = layer_envelope(client, repo, layer, budget)
    except BlobNotFound:
        # No reader can read it, and the registry refuses a manifest that names it: dropped, named.
        return Decision("gone", Replaced(f"layer {layer.get('digest')}", "?", "?"), GONE)
    except RegistryError:
        return None  # a layer that cannot be read is kept: only what is read as ours is replaced
    return judge(new, envelope, image, f"layer {layer.get('digest')}", layer_material(layer))


def statement_of(envelope: dsse.Envelope) -> dict[str, Any]:
    try:
        st = untrusted_json.loads(envelope.payload, max_bytes=MAX_ENVELOPE_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"attestation: the payload is {e}") from e
    if not isinstance(st, dict):
        raise UsageError("attestation: the payload is not an in-toto Statement")
    return st


def fetch(
    client: RegistryClient, image: RemoteImage, budget: ReadBudget | None = None
) -> list[FetchedEnvelope]:
    """Every DSSE envelope attached to the image (all predicate types; the caller chooses)."""
    repo = image.reference.repository
    tag = attestation_tag(image.digests[0])
    budget = budget or ReadBudget(f"{image.reference.registry}/{repo}@{image.digests[0]}")
    doc = _existing(client, repo, tag)
    if doc is None:
        return []
    budget.listing(len(doc["layers"]), f"tag {tag}")
    out = []
    for n, layer in enumerate(doc["layers"], 1):
        env = layer_envelope(client, repo, layer, budget)
        if env is not None:
            where = f"{image.reference.registry}/{repo}:{tag} layer {n}"
            out.append(FetchedEnvelope(where, env, layer_material(layer)))
    return out
