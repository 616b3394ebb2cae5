"""What `imagegate keygen`, `verify`, `attach` and `index` print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from imagegate._support import jsontypes as j

if TYPE_CHECKING:
    from imagegate.attest.attach import Attached
    from imagegate.attest.keys import SigningKey
    from imagegate.attest.referrers import Referred
    from imagegate.attest.verify import Report
    from imagegate.domain.statements import Predicate, Statement

_MARK = {"ok": "ok     ", "failed": "FAILED ", "skipped": "skipped"}


def render_keypair(private: Path, public: Path, key: SigningKey, *, passphrase: bool) -> None:
    from imagegate.attest.keys import PASSWORD_ENV

    protected = "passphrase-protected" if passphrase else f"no passphrase (set {PASSWORD_ENV} for one)"
    print(f"private key: {private} (mode 0600, {protected})")
    print(f"public key:  {public}")
    print(f"fingerprint: {key.public.fingerprint} ({key.algorithm})")


def render_token_key(uri: str, public: Path, key: SigningKey, kept: str = "in the token: sensitive") -> None:
    """`kept`: where the private half stays, and how."""
    print(f"private key: {uri} ({kept}, not extractable)")
    print(f"public key:  {public}")
    print(f"fingerprint: {key.public.fingerprint} ({key.algorithm})")


def render_verify(report: Report, conclusion: str) -> None:
    """`conclusion`: attest.verify.accepts's sentence."""
    print(f"attestation: {report.source}")
    for c in report.checks:
        print(f"  {_MARK[c.outcome]} {c.name}: {c.detail}")
    print(conclusion)


def render_attached(done: Attached | None, referred: Referred) -> None:
    """`done`: the `.att` tag as written; None where only the referrer was (keyless)."""
    if done is None:
        pass
    elif done.already:
        print(f"already attached: {done.reference} ({done.tag}, layer {done.layer_digest})")
    else:
        print(f"attached to {done.reference}: {done.tag} now holds {done.layers} attestation(s)")
        print(f"  layer {done.layer_digest}, manifest {done.manifest_digest}")
    said = "already a referrer" if referred.already else "referrer"
    print(f"{said} {referred.manifest_digest}, listed by {referred.via}")
    for gone in (*(done.replaced if done else ()), *referred.replaced):
        print(f"  replaced {gone.describe()}")
    for kept in (*(done.kept if done else ()), *referred.kept):
        print(f"  kept {kept.describe()}")
    for dropped in done.dropped if done else ():
        print(f"  dropped {dropped}")


def render_index(statement: Statement[Predicate], folder: Path) -> None:
    """An index statement: each platform listed with what its run said, then the verdict."""
    pred = statement.predicate.to_json()
    image = j.obj(pred.get("image"))
    print(f"index {image.get('reference')} ({image.get('indexDigest')})")
    for e in j.objects(pred.get("platforms")):
        said = f"{e.get('verdict')} (attempt {e.get('attempt')})" if e.get("ran") else "not run"
        print(f"  {e.get('platform')!s:<16} {e.get('manifestDigest')}  {said}")
    for ignored in j.objects(pred.get("ignoredManifests")):
        print(f"  ignored {ignored.get('digest')}: {ignored.get('why')}")
    print(f"verdict: {pred.get('verdict')}")
    print(f"levels: {', '.join(j.strings(pred.get('levels'))) or 'none'}")
    print(f"evidence: {folder}")
