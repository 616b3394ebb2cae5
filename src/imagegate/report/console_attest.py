"""What `imagegate keygen`, `verify` and `attach` print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imagegate.attest.attach import Attached
    from imagegate.attest.keys import SigningKey
    from imagegate.attest.referrers import Referred
    from imagegate.attest.verify import Report

_MARK = {"ok": "ok     ", "failed": "FAILED ", "skipped": "skipped"}


def render_keypair(private: Path, public: Path, key: SigningKey, *, passphrase: bool) -> None:
    from imagegate.attest.keys import PASSWORD_ENV

    protected = "passphrase-protected" if passphrase else f"no passphrase (set {PASSWORD_ENV} for one)"
    print(f"private key: {private} (mode 0600, {protected})")
    print(f"public key:  {public}")
    print(f"fingerprint: {key.public.fingerprint} ({key.algorithm})")


def render_verify(report: Report, conclusion: str) -> None:
    """`conclusion`: attest.verify.accepts's sentence."""
    print(f"attestation: {report.source}")
    for c in report.checks:
        print(f"  {_MARK[c.outcome]} {c.name}: {c.detail}")
    print(conclusion)


def render_attached(done: Attached, referred: Referred) -> None:
    if done.already:
        print(f"already attached: {done.reference} ({done.tag}, layer {done.layer_digest})")
    else:
        print(f"attached to {done.reference}: {done.tag} now holds {done.layers} attestation(s)")
        print(f"  layer {done.layer_digest}, manifest {done.manifest_digest}")
    said = "already a referrer" if referred.already else "referrer"
    print(f"{said} {referred.manifest_digest}, listed by {referred.via}")
