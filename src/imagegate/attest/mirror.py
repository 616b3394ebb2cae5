"""Mirror equivalence as a signed fact: `imagegate compare OFFICIAL MIRROR --attest KEY` signs one
in-toto statement whose subjects are both manifests, with what proves them the same image (the
config digest equal, every diffID of both verified in this run, which compressed digests
differ). Only for `same content` between two registry images; never for a different image or a
corrupt one. With `--carry ACCEPTANCE` an acceptance of the official image (its signature
verified with a trusted key, its subject the official manifest digest just compared) is carried
over: an SLSA VSA and an in-toto test-result for the mirror's digest, resting on both signed
statements, so that the same admission policy admits the mirror without re-running the probes."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from imagegate import __version__
from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping, JsonObject
from imagegate.attest import bundle, dsse
from imagegate.attest.keys import PublicKey, SigningKey
from imagegate.attest.sign import (
    TEST_RESULT_BUNDLE_FILE,
    TEST_RESULT_FILE,
    VSA_BUNDLE_FILE,
    VSA_FILE,
    create_once,
    serialize,
)
from imagegate.attest.vsa import build_test_result, build_vsa
from imagegate.domain.statements import Predicate, RawPredicate, Statement, Subject
from imagegate.errors import UsageError
from imagegate.oci.compare import COMPARED_BLOBS, ComparedImage, CompareResult, Verdict

MIRROR_PREDICATE_TYPE = "https://imagegate.dev/attestations/mirror/v1"
EQUIVALENCE_FILE = "mirror.dsse.json"
EQUIVALENCE_BUNDLE_FILE = "mirror.sigstore.json"


@dataclass(frozen=True)
class Equivalence:
    files: list[Path]
    envelopes: list[dsse.Envelope]  # the equivalence statement, then the carried ones


def _repository(side: ComparedImage) -> str:
    return (
        side.source.removeprefix("docker://").rpartition("@")[0]
        or side.source.removeprefix("docker://").rsplit(":", 1)[0]
    )


def _subject(side: ComparedImage) -> Subject:
    algo, _, hexd = str(side.manifest_digest).partition(":")
    return Subject(_repository(side), {algo: hexd})


def check_equivalent(result: CompareResult) -> None:
    """Refuses anything but two registry manifests proven the same content in this run."""
    if result.verdict is not Verdict.SAME_CONTENT:
        raise UsageError(
            f"compare said {result.verdict.value.lower().replace('_', ' ')}: no equivalence is signed",
            hint="only a mirror with the same content (config digest and every diffID equal) gets one",
        )
    sides = (result.official, result.mirror)
    if result.compared != COMPARED_BLOBS or not all(s.manifest_digest and s.report for s in sides):
        raise UsageError(
            "--attest needs two registry images whose blobs were read in this run "
            f"({result.official.source}, {result.mirror.source})",
            hint="compare registry references (an archive has no manifest digest an admission controller checks)",
        )


def equivalence_statement(result: CompareResult) -> Statement[RawPredicate]:
    check_equivalent(result)
    o, m = result.official, result.mirror
    differ = [i for i, (a, b) in enumerate(zip(o.layer_digests, m.layer_digests, strict=True)) if a != b]
    return Statement(
        subject=(_subject(o), _subject(m)),
        predicate_type=MIRROR_PREDICATE_TYPE,
        predicate=RawPredicate(
            j.freeze_object(
                {
                    "verdict": result.verdict.value,
                    "sentence": result.sentence,
                    "configDigest": o.config_digest,
                    "diffIds": list(o.diff_ids),
                    "official": {
                        "source": o.source,
                        "manifestDigest": o.manifest_digest,
                        "layerDigests": list(o.layer_digests),
                    },
                    "mirror": {
                        "source": m.source,
                        "manifestDigest": m.manifest_digest,
                        "layerDigests": list(m.layer_digests),
                    },
                    "compressedDigestsDiffer": differ,
                    "verifiedOn": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
                    + "Z",
                    "imagegate": {"version": __version__},
                }
            )
        ),
    )


def carried(
    acceptance: JsonMapping,
    acceptance_uri: str,
    acceptance_bytes: bytes,
    equivalence: Statement[RawPredicate],
    equivalence_bytes: bytes,
) -> list[Statement[Predicate]]:
    """The acceptance's VSA and test-result, for the mirror's subject: the same verdict, resting
    on the official's signed acceptance and on the signed equivalence."""
    mirror = j.obj(equivalence.predicate.fields.get("mirror"))
    subject = equivalence.subject[1]
    pred = j.obj(acceptance.get("predicate"))
    image = dict(j.obj(pred.get("image")))
    image.update(repository=subject.name, manifestDigest=mirror["manifestDigest"], subjectDigest="manifest")
    as_mirror = {**acceptance, "subject": [subject.to_json()], "predicate": {**pred, "image": image}}
    vsa = build_vsa(as_mirror, acceptance_uri, acceptance_bytes)
    equivalent: JsonObject = {
        "uri": EQUIVALENCE_FILE,
        "digest": {"sha256": hashlib.sha256(equivalence_bytes).hexdigest()},
    }
    inputs = (*vsa.predicate.input_attestations, equivalent)
    vsa = replace(vsa, predicate=replace(vsa.predicate, input_attestations=inputs))
    return [vsa, build_test_result(as_mirror)]


def _write(out: Path, name: str, data: bytes) -> Path:
    return create_once(out / name, data, "signing never replaces a file", "pass another --out")


def sign_equivalence(
    result: CompareResult, key: SigningKey, out: Path, carry: tuple[JsonMapping, str, bytes] | None = None
) -> Equivalence:
    """`carry`: the official acceptance statement, its file name and bytes, already verified."""
    statement = equivalence_statement(result)
    out.mkdir(parents=True, exist_ok=True)
    env = dsse.sign(serialize(statement), key)
    env_bytes = env.to_json()
    files = [
        _write(out, EQUIVALENCE_FILE, env_bytes),
        _write(out, EQUIVALENCE_BUNDLE_FILE, bundle.to_json(env, key.public)),
    ]
    envelopes = [env]
    if carry is not None:  # named as a run names them: the same policies and commands apply
        names = ((VSA_FILE, VSA_BUNDLE_FILE), (TEST_RESULT_FILE, TEST_RESULT_BUNDLE_FILE))
        for made, (name, bundle_name) in zip(carried(*carry, statement, env_bytes), names, strict=True):
            signed = dsse.sign(serialize(made), key)
            files.append(_write(out, name, signed.to_json()))
            files.append(_write(out, bundle_name, bundle.to_json(signed, key.public)))
            envelopes.append(signed)
    return Equivalence(files, envelopes)


def verified_acceptance(
    path: Path, trusted: tuple[PublicKey, ...], official_digest: str
) -> tuple[JsonMapping, str, bytes]:
    """The acceptance to carry: its signature with a trusted key, its subject the official
    manifest digest compared now, an accepting verdict; else a UsageError naming what failed."""
    from imagegate.attest.envelopes import read_bounded
    from imagegate.attest.verify import verify_file

    rep = verify_file(path, trusted, image_digests=[official_digest], evidence=False)
    if not rep.ok or rep.statement is None:
        why = "; ".join(f"{c.name}: {c.detail}" for c in rep.failures)
        raise UsageError(
            f"--carry {path}: does not verify for the official image: {why}",
            hint="carry the official image's own signed acceptance, with --trust its key",
        )
    if build_vsa(rep.statement, "", b"").predicate.verification_result != "PASSED":
        raise UsageError(f"--carry {path}: verdict {rep.verdict} does not accept the image: nothing to carry")
    return rep.statement, path.name, read_bounded(path)
