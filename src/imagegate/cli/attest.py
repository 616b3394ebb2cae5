"""Commands: keygen, verify, attach (signed attestations)."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

import typer

from imagegate.attest import keys
from imagegate.attest.statement import PREDICATE_TYPE
from imagegate.cli._app import app
from imagegate.errors import UsageError
from imagegate.model import EXIT_ACCEPTED, EXIT_REJECTED


class KeyAlgorithm(str, enum.Enum):
    ecdsa_p256 = "ecdsa-p256"
    ed25519 = "ed25519"


@app.command(
    epilog="Examples:\n\n"
    "  imagegate keygen                      # imagegate.key + imagegate.pub here\n\n"
    "  IMAGEGATE_KEY_PASSWORD=... imagegate keygen --out ci/gate\n\n"
    "  imagegate keygen --algorithm ed25519 --out ~/.keys/gate\n\n"
    f"The passphrase, if any, comes from ${keys.PASSWORD_ENV}; sign with it by passing "
    f"--key PREFIX.key to run or setting ${keys.KEY_ENV}. The .pub file is what verifiers "
    "(imagegate verify, cosign verify-attestation --key) need."
)
def keygen(
    out: Path = typer.Option(
        Path("imagegate"), "--out", "-o", help="Prefix: writes PREFIX.key (mode 0600) and PREFIX.pub."
    ),
    algorithm: KeyAlgorithm = typer.Option(
        KeyAlgorithm.ecdsa_p256, "--algorithm", help="ecdsa-p256 (cosign's default) or ed25519."
    ),
) -> None:
    """Make a signing key pair: a PKCS#8 PEM private key and its PEM public key."""
    key = keys.generate(algorithm.value)
    password = keys.password_from_env(os.environ)
    priv, pub = keys.write_keypair(out, key, password)
    protected = "passphrase-protected" if password else f"no passphrase (set {keys.PASSWORD_ENV} for one)"
    print(f"private key: {priv} (mode 0600, {protected})")
    print(f"public key:  {pub}")
    print(f"fingerprint: {key.public.fingerprint} ({key.algorithm})")


_MARK = {"ok": "ok     ", "failed": "FAILED ", "skipped": "skipped"}


def _render(report: Any) -> None:  # verify.Report
    print(f"attestation: {report.source}")
    for c in report.checks:
        print(f"  {_MARK[c.outcome]} {c.name}: {c.detail}")
    if report.ok:
        print(f"verified: verdict {report.verdict}")
    else:
        print("NOT verified: " + "; ".join(f"{c.name}: {c.detail}" for c in report.failures))


@app.command(
    epilog="Examples:\n\n"
    "  imagegate verify runs/sha256-ab12…/20260101T000000.000Z-1a2b3c/attestation.dsse.json --key imagegate.pub\n\n"
    "  imagegate verify attestation.sigstore.json --key ci.pub --image 127.0.0.1:5000/team/vllm:0.11 --expect-verdict PASS\n\n"
    "  imagegate verify --image registry.example/team/vllm:0.11 --key ci.pub   # what is attached in the registry\n\n"
    "Checks: the signature, the subject against the image's digest (with --image), every evidence "
    "file the statement lists, by sha256, in the attestation's folder or --evidence DIR (a missing "
    "file fails, named; --signature-only skips them), the verdict (with --expect-verdict). "
    "Exit 0 when all pass, 1 naming what differs, 3 for unreadable input."
)
def verify(
    attestation: Path = typer.Argument(
        None,
        help="attestation.dsse.json, .intoto.jsonl or .sigstore.json; omit with --image to fetch from the registry.",
    ),
    key: Path = typer.Option(..., "--key", "-k", help="The signer's public key (PEM)."),
    image: str = typer.Option(
        None, "--image", help="The image the subject must be: a registry reference or a sha256: digest."
    ),
    expect_verdict: str = typer.Option(
        None, "--expect-verdict", help="Fail unless the verdict is this (e.g. PASS)."
    ),
    evidence: Path = typer.Option(
        None,
        "--evidence",
        help="The attempt folder to check the evidence in (default: beside the attestation).",
    ),
    signature_only: bool = typer.Option(
        False,
        "--signature-only",
        help="Check the signed statement only (signature, subject, verdict), not the evidence files it lists.",
    ),
    no_evidence: bool = typer.Option(False, "--no-evidence", hidden=True),  # the earlier name
    predicate_type: str = typer.Option(PREDICATE_TYPE, "--type", help="The predicate type to expect."),
    insecure: bool = typer.Option(
        False, "--insecure", help="Registry over HTTPS without certificate checks, or plain HTTP."
    ),
) -> None:
    """Verify a signed acceptance attestation: signature, subject, evidence, verdict."""
    from imagegate.attest import verify as verifying  # lazy: keeps CLI start-up fast

    pub = keys.load_public_key(key)
    if attestation is None:
        if image is None:
            raise UsageError("nothing to verify", hint="pass an ATTESTATION file, or --image REF to fetch it")
        report = verifying.verify_image(
            image, pub, expect_verdict=expect_verdict, predicate_type=predicate_type, insecure=insecure
        )
    else:
        name, digests = verifying.image_digests(image, insecure=insecure) if image else (None, [])
        report = verifying.verify_file(
            attestation,
            pub,
            image_digests=digests,
            image_name=name,
            evidence_dir=evidence,
            evidence=not (signature_only or no_evidence),
            expect_verdict=expect_verdict,
            predicate_type=predicate_type,
        )
    _render(report)
    raise typer.Exit(EXIT_ACCEPTED if report.ok else EXIT_REJECTED)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate attach runs/…/attestation.dsse.json 127.0.0.1:5000/team/vllm:0.11\n\n"
    "  imagegate attach attestation.sigstore.json registry.example/team/vllm@sha256:…\n\n"
    "Pushes the attestation as `cosign attest --key` does: tag sha256-<hex>.att in the image's "
    "repository, one DSSE layer per attestation, added to those already there. Registry "
    "credentials come from the usual docker/podman auth files."
)
def attach(
    attestation: Path = typer.Argument(
        ..., help="attestation.dsse.json, .intoto.jsonl (one line) or .sigstore.json."
    ),
    image: str = typer.Argument(
        ..., help="The image in its registry; its digest must be the attestation's subject."
    ),
    insecure: bool = typer.Option(
        False, "--insecure", help="Registry over HTTPS without certificate checks, or plain HTTP."
    ),
) -> None:
    """Attach a signed attestation to an image in its registry, where cosign and admission
    controllers look for it."""
    from imagegate.attest import attach as attaching  # lazy: keeps CLI start-up fast

    done = attaching.attach_file(attestation, image, insecure=insecure)
    if done.already:
        print(f"already attached: {done.reference} ({done.tag}, layer {done.layer_digest})")
    else:
        print(f"attached to {done.reference}: {done.tag} now holds {done.layers} attestation(s)")
        print(f"  layer {done.layer_digest}, manifest {done.manifest_digest}")
