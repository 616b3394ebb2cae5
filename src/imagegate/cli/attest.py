"""Commands: keygen, verify, attach, index (signed attestations). Parse, call imagegate.attest, render."""

import enum
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer import Argument

from imagegate._support.names import (
    KEY_ENV,
    PASSWORD_ENV,
    PKCS11_PIN_ENV,
    PREDICATE_TYPE,
    VAULT_ADDR_ENV,
    VAULT_TOKEN_ENV,
    VAULT_TRANSIT_ENV,
)
from imagegate.cli import _app
from imagegate.cli._accept import grouped
from imagegate.cli._app import Option, app
from imagegate.cli._identity import Identity
from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `--help` loads no key code
    from imagegate.attest import keyless, keys


class KeyAlgorithm(str, enum.Enum):
    ecdsa_p256 = "ecdsa-p256"
    ed25519 = "ed25519"


@app.command(
    epilog="Examples:\n\n"
    "  imagegate keygen                      # imagegate.key + imagegate.pub here\n\n"
    "  IMAGEGATE_KEY_PASSWORD=... imagegate keygen --out ci/gate\n\n"
    "  imagegate keygen --algorithm ed25519 --out ~/.keys/gate\n\n"
    "  IMAGEGATE_PKCS11_PIN=... imagegate keygen --out 'pkcs11:token=ci;object=gate?module-path=/usr/lib/softhsm/libsofthsm2.so'\n\n"
    "  VAULT_ADDR=https://vault:8200 VAULT_TOKEN=... imagegate keygen --out hashivault://gate\n\n"
    f"The passphrase, if any, comes from ${PASSWORD_ENV}; sign with it by passing "
    f"--key PREFIX.key to run or setting ${KEY_ENV}. The .pub file is what verifiers "
    "(imagegate verify, cosign verify-attestation --key) need. A pkcs11: URI (RFC 7512, as cosign "
    "names keys) makes an ECDSA P-256 key inside the token, sensitive and not extractable, and "
    f"writes only its public half; sign with --key URI (the user PIN from ${PKCS11_PIN_ENV} or "
    "pin-source=FILE). hashivault://NAME (as cosign names it) makes the key in Vault's transit "
    f"engine, not exportable (the server from ${VAULT_ADDR_ENV}, the token from ${VAULT_TOKEN_ENV}, "
    f"the engine's mount from ${VAULT_TRANSIT_ENV}, default transit), and writes its public half."
)
def keygen(
    out: str = Option(
        "imagegate",
        "--out",
        "-o",
        metavar="PREFIX|URI",
        help="Prefix: writes PREFIX.key (mode 0600) and PREFIX.pub; or a pkcs11: URI or hashivault://NAME: "
        "the key is made in the token or in Vault.",
    ),
    algorithm: KeyAlgorithm = Option(
        KeyAlgorithm.ecdsa_p256, "--algorithm", help="ecdsa-p256 (cosign's default) or ed25519."
    ),
    pub: Path | None = Option(
        None,
        "--pub",
        help="With a pkcs11: or hashivault:// --out: where to write the public key (default: LABEL.pub or NAME.pub here).",
    ),
) -> None:
    """Make a signing key pair: a PKCS#8 PEM private key and its PEM public key, or a key in a token or Vault."""
    # Here, as every layer below and the views: `--help` and completion load none of them.
    from imagegate.attest import keys
    from imagegate.report import console_attest

    if _keygen_in_store(out, algorithm, pub):
        return
    if pub is not None:
        raise UsageError(
            "--pub goes with a pkcs11: or hashivault:// --out",
            hint="a PEM key pair is PREFIX.key and PREFIX.pub",
        )
    key = keys.generate(algorithm.value)
    password = keys.password_from_env(os.environ)
    private, public = keys.write_keypair(Path(out), key, password)
    console_attest.render_keypair(private, public, key, passphrase=bool(password))


def _keygen_in_store(out: str, algorithm: KeyAlgorithm, pub: Path | None) -> bool:
    """keygen --out pkcs11:… or hashivault://…: the key made in its store, its public half
    written; False for a PEM key pair's prefix."""
    from imagegate.attest import keys
    from imagegate.report import console_attest

    if out.startswith("sigstore:"):
        raise UsageError(
            f"{out}: a keyless signer has no key to make (each run's is made for it and certified by Fulcio)",
            hint=f"sign with --key {out}",
        )
    if out.startswith("pkcs11:"):
        from imagegate.attest import hsm

        if algorithm is not KeyAlgorithm.ecdsa_p256:
            raise UsageError(
                f"--algorithm {algorithm.value}: a key in a token is ECDSA P-256",
                hint="drop --algorithm (ed25519 keys are PEM files only)",
            )
        made = hsm.generate(out)
        target = pub or Path(f"{made.ref.label}.pub")
        keys.write_public(target, made.public)
        console_attest.render_token_key(made.where, target, made)
        return True
    if out.startswith("hashivault://"):
        from imagegate.attest import kms

        transit = kms.generate(out, os.environ, algorithm.value)
        target = pub or Path(f"{transit.name}.pub")
        keys.write_public(target, transit.public)
        console_attest.render_token_key(
            transit.where, target, transit, f"in Vault's transit engine at {transit.server.address}"
        )
        return True
    return False


@app.command(
    "public-key",
    epilog="Examples:\n\n"
    "  imagegate public-key --key ci.key --out ci.pub\n\n"
    "  imagegate public-key --key 'pkcs11:token=ci;object=gate?module-path=...' > gate.pub\n\n"
    "  imagegate public-key --key hashivault://gate --out gate.pub\n\n"
    "As cosign public-key: the PEM public key verifiers are given, read from the key (a token's "
    "public key object, its PIN from the URI or the environment; a transit key's newest version, "
    "the server and token from VAULT_ADDR and VAULT_TOKEN).",
)
def public_key(
    key: str | None = Option(
        None,
        "--key",
        "-k",
        metavar="KEY|URI",
        help=f"The signing key: a PEM file, a pkcs11: URI or hashivault://NAME (default: ${KEY_ENV}, else the user's key).",
    ),
    out: Path | None = Option(
        None, "--out", "-o", help="Write it here (never over a file) instead of stdout."
    ),
) -> None:
    """Print or write the public half of a signing key."""
    from imagegate.attest import keys

    named = keys.named_signer(key)
    # a transit key's public half needs only `read` on it: a token that may not sign reads it too
    if named and named.startswith("hashivault://"):
        from imagegate.attest import kms

        public = kms.public_key(named, os.environ)
    elif named and named.startswith("sigstore:"):
        raise UsageError(
            f"{named} signs keyless: its key is made for each run and has no public half to keep",
            hint="verifiers check who signed: imagegate verify BUNDLE --identity ID --issuer URL --trusted-root FILE",
        )
    else:
        public = keys.resolve_signing_key(key, create_default=False).public
    if out is None:
        sys.stdout.write(public.pem.decode())
        return
    keys.write_public(out, public)
    print(f"public key:  {out}\nfingerprint: {public.fingerprint} ({public.algorithm})", file=sys.stderr)


@dataclass(frozen=True)
class Verifying:
    """verify's options: the keys, what the statement must say, where its evidence is."""

    key: list[Path] = Option(
        [],
        "--key",
        "-k",
        metavar="PUB",
        help="A signer's public key (PEM); repeatable: each envelope of a chain may be signed by any of them. "
        f"Default: the public half of the key run signs with (${KEY_ENV}, else the user's key).",
    )
    trusted_keys: list[Path] = _app.TRUSTED_KEYS
    image: str | None = Option(
        None, "--image", help="The image the subject must be: a registry reference or a sha256: digest."
    )
    expect_verdict: str | None = Option(
        None,
        "--expect-verdict",
        help="Accept only this verdict, in place of the rule (e.g. PASS: a deferred one fails; FAIL: check a rejection was signed).",
    )
    require_complete: bool = _app.REQUIRE_COMPLETE
    evidence: Path | None = Option(
        None,
        "--evidence",
        help="The attempt folder to check the evidence in (default: beside the attestation).",
    )
    signature_only: bool = Option(
        False,
        "--signature-only",
        help="Check the signed statement only (signature, subject, verdict), not the evidence files it lists.",
    )
    no_evidence: bool = Option(False, "--no-evidence", hidden=True)  # the earlier name
    predicate_type: str = Option(
        PREDICATE_TYPE,
        "--type",
        help="The predicate type to expect: its URI, or acceptance, index, vsa, test-result, mirror, node-check.",
    )
    pipeline: str | None = Option(
        None,
        "--pipeline",
        metavar="PIPELINE",
        help="With --image and no file: read only this pipeline's statements (a built-in name or the file path it ran with).",
    )
    max_age: str | None = Option(
        None,
        "--max-age",
        metavar="AGE",
        help="With --image and no file: how long ago a statement may have been said (in s, m, h or d; 0: any age); default: the shipped policies' bound, 168h.",
    )
    insecure: bool = _app.INSECURE
    timeout: float = _app.VERIFY_TIMEOUT


@app.command(
    epilog="Examples:\n\n"
    "  imagegate verify runs/sha256-ab12…/20260101T000000.000Z-1a2b3c/attestation.dsse.json --key imagegate.pub\n\n"
    "  imagegate verify attestation.sigstore.json --key ci.pub --image 127.0.0.1:5000/team/vllm:0.11 --expect-verdict PASS\n\n"
    "  imagegate verify --image registry.example/team/vllm:0.11 --key ci.pub   # what is attached in the registry\n\n"
    "  imagegate verify runs/…/<completion>/attestation.dsse.json --key ci.pub --key gpu.pub   # a chain signed on two machines\n\n"
    "Checks: the signature (with any of the keys given; the report names which verified each "
    "envelope, the completion's and, for a completion, each earlier one it links), the subject against the image's digest (with --image), every evidence "
    "file the statement lists, by sha256, in the attestation's folder or --evidence DIR (a missing "
    "file fails, named; --signature-only skips them), then the verdict: accepted as `run` "
    "exits on it (PASS, or a deferred verdict that reaches a level, whose levels are named; FAIL, "
    "ERROR and a verdict that reaches no level are not; "
    "--require-complete refuses a deferred one; --expect-verdict V accepts V alone). "
    "With --image and no file, the statements attached to the image are read as the shipped "
    "ClusterPolicy reads them: only those that verify with a key given count, and every one of "
    "them must accept the image and be no older than --max-age (168h); it judges the newest that "
    "refuses, else the newest (--pipeline reads one pipeline's). "
    "Exit 0 when it verifies and is accepted, 1 naming what differs or the verdict refused, 2 "
    "when the registry could not be read (or --timeout passed), 3 for unreadable input."
)
@grouped
def verify(
    attestation: Path | None = Argument(
        None,
        help="attestation.dsse.json, .intoto.jsonl or .sigstore.json, or a run's attempt folder; omit with --image to fetch from the registry.",
    ),
    v: Verifying = Verifying(),
    who: Identity = Identity(),
) -> None:
    """Verify a signed acceptance attestation: signature, subject, evidence, verdict."""
    from imagegate.attest import keys
    from imagegate.attest.predicates import predicate_type_named  # lazy: keeps CLI start-up fast
    from imagegate.attest.verify import accepts, attestation_in
    from imagegate.attest.verify import verify as verify_attestation
    from imagegate.attest.word import Scope
    from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED
    from imagegate.report import console_attest

    if attestation is not None:  # an unsigned run needs no key to be told so
        attestation = attestation_in(attestation)
    keyless = who.expected("keyless verification")
    trusted = keys.trusted_keys(v.key, v.trusted_keys) or (() if keyless else _runs_key())
    if (v.pipeline or v.max_age) and (attestation is not None or v.image is None):
        raise UsageError(
            "--pipeline and --max-age read the statements attached to an image",
            hint="pass --image REF without an ATTESTATION file",
        )
    scope = Scope.of(v.pipeline, v.max_age)
    with _app.within(v.timeout):
        report = verify_attestation(
            attestation,
            trusted,
            image=v.image,
            evidence_dir=v.evidence,
            evidence=not (v.signature_only or v.no_evidence),
            expect_verdict=v.expect_verdict,
            predicate_type=predicate_type_named(v.predicate_type),
            insecure=v.insecure,
            scope=scope,
            keyless=keyless,
        )
    ok, conclusion = accepts(report, expect_verdict=v.expect_verdict, require_complete=v.require_complete)
    console_attest.render_verify(report, conclusion)
    raise typer.Exit(EXIT_ACCEPTED if ok else EXIT_REJECTED)


def _runs_key() -> "tuple[keys.PublicKey, ...]":
    """verify given no key: the public half of the key `run` signs with (the one a first run
    made), named in one line, so that a run's statement verifies as the run left it."""
    from imagegate.attest import keys

    found = keys.runs_public_key()
    if isinstance(found, Path):
        raise UsageError(
            "no public key to verify with",
            hint=f"pass --key PUB (repeatable) or --trusted-keys FILE (run's signing key {found} does not exist)",
        )
    print(f"verify: using the signing key's public half {found.where} ({found.origin})", file=sys.stderr)
    return (found.public,)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate attach runs/…/attestation.dsse.json 127.0.0.1:5000/team/vllm:0.11 --key ci.pub\n\n"
    "  imagegate attach attestation.sigstore.json registry.example/team/vllm@sha256:… --key ci.pub\n\n"
    "Pushes the attestation in both forms cosign reads: as cosign 2's `cosign attest --key`, tag "
    "sha256-<hex>.att in the image's repository, one DSSE layer per attestation; and as cosign 3's, "
    "an OCI 1.1 referrer of the image holding a Sigstore bundle (the referrers API, "
    "or the sha256-<hex> tag where the registry lacks it); the bundle names the signing key, so a "
    "bare .dsse.json needs the .sigstore.json imagegate wrote beside it. "
    "An attempt's acceptance brings the VSA and test-result signed beside it. Each must verify "
    "with a key given (--key, --trusted-keys), else nothing is written. Each supersedes, for that "
    "image, only the earlier statements of its type and pipeline signed by the same key and older "
    "(admission controllers read every one), and says which; another signer's, another tool's, "
    "another pipeline's and any that does not verify stay, named with why. A statement older than "
    "one its signer already attached for the pipeline is refused. Exit 0 when attached, 1 when "
    "it does not verify, is older than what is there, or the registry refused to delete a "
    "superseded referrer (named: controllers still read it), 2 when the registry could not be "
    "read, 3 for unreadable input. Registry credentials come from the usual docker/podman auth files."
)
def attach(
    attestation: Path = Argument(
        ..., help="attestation.dsse.json, .intoto.jsonl (one line) or .sigstore.json."
    ),
    image: str = Argument(
        ..., help="The image in its registry; its digest must be the attestation's subject."
    ),
    key: list[Path] = Option(
        [],
        "--key",
        "-k",
        metavar="PUB",
        help="The signer's public key (PEM), repeatable: the attestation must verify with one of them.",
    ),
    trusted_keys: list[Path] = _app.TRUSTED_KEYS,
    insecure: bool = _app.INSECURE,
) -> None:
    """Attach a signed attestation to an image in its registry, where cosign and admission
    controllers look for it."""
    from imagegate.attest import keys, referrers
    from imagegate.attest.attach import parse_image
    from imagegate.attest.referrers import attach_file  # lazy: keeps CLI start-up fast
    from imagegate.errors import EXIT_REJECTED, NotVerified
    from imagegate.report import console_attest

    trusted = keys.trusted_keys(key, trusted_keys)
    if not trusted:
        raise NotVerified(
            f"{attestation}: no public key to verify it with; nothing attached (only a statement "
            "that verifies is written, and it supersedes only its own signer's earlier word)",
            hint="pass the signer's public key: --key PUB (repeatable) or --trusted-keys FILE",
        )
    pairs = attach_file(attestation, image, trusted, insecure=insecure)
    for done, referred in pairs:
        console_attest.render_attached(done, referred)
    if any((done and done.replaced) or referred.replaced for done, referred in pairs):
        print(referrers.REPLACED_KEPT)
    left = referrers.remaining(pairs, parse_image(image).repository)
    if left is not None:
        print(f"imagegate: {left}", file=sys.stderr)
        raise typer.Exit(EXIT_REJECTED)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate index registry.example/team/app:1 runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --key ci.key --attach\n\n"
    "  imagegate index registry.example/team/app:1 amd64-run/ arm64-run/ --key ci.key --trust arm-runner.pub\n\n"
    "  imagegate index registry.example/team/app:1 amd64-run/ arm64-run/ --key sigstore:trust.json \\\n"
    "    --identity https://github.com/org/app/.github/workflows/ci.yml@refs/heads/main \\\n"
    "    --issuer https://token.actions.githubusercontent.com --trusted-root trusted_root.json\n\n"
    "Admission resolves a tag to the index digest, while a run judges one platform (its subject is "
    "that platform's manifest). This signs statements whose subject is the index: the index is read "
    "once, by the digest IMAGE names now; its platform images are listed (attestation manifests and "
    "other non-image entries are ignored, named); each RUN must verify as verify checks an attempt "
    "(a trusted key: --trust, --trusted-keys, else the signing key's own; or keyless the identity "
    "its certificate proves: --identity/--issuer/--trusted-root, else a keyless signer's own; "
    "every evidence file), "
    "else exit 1, and must be a run of one of those platform manifests with the same pipeline as "
    "the others, else exit 3. The verdict is PASS only when every listed platform has a PASS "
    "run; FAIL or ERROR when a platform's run says so; otherwise "
    "CPU_PASS_<deferred stages, PLATFORM_<OS>_<ARCH>… not run>_DEFERRED, never PASS. The VSA's "
    "levels are those every platform reached (FAILED when a platform did not run), its "
    "timeVerified the oldest run's. Writes OUT/index-<digest>/<attempt>/ (each run's envelope "
    "copied, the statement, the VSA and test-result); --attach pushes them to the index digest, "
    "replacing the earlier index statements of the pipeline there. Exit codes as for run."
)
@grouped
def index(
    image: str = Argument(..., help="The multi-platform image in its registry: a tag or an index digest."),
    runs: list[Path] = Argument(
        ..., help="Signed attempt folders (or their attestation files), one per platform run."
    ),
    key: list[str] = _app.SIGNING_KEY,
    trust: list[Path] = _app.TRUST,
    trusted_keys: list[Path] = _app.TRUSTED_KEYS,
    out: Path = Option(Path("imagegate-runs"), "--out", "-o", metavar="FOLDER", help=_app.EVIDENCE_HELP),
    attach: bool = Option(
        False, "--attach", help="Push the index statements to the index digest in its registry."
    ),
    require_complete: bool = _app.REQUIRE_COMPLETE,  # an index: a platform not run among them is deferred
    insecure: bool = _app.INSECURE,
    timeout: float = _app.VERIFY_TIMEOUT,
    fmt: _app.Format = _app.FORMAT,
    who: Identity = Identity(),
) -> None:
    """Sign the verdict about a multi-platform index from the runs of its platforms."""
    from imagegate.attest import keys
    from imagegate.attest.sign import serialize
    from imagegate.cli._accept import notifier, signing_key
    from imagegate.cli._checks import alert
    from imagegate.report import console_attest
    from imagegate.usecases.index import judge_index

    signer = keys.resolve_signing_key(signing_key(key), notify=notifier(False))
    trusted, keyless = _runs_trust(signer, keys.trusted_keys(trust, trusted_keys), who)
    with _app.within(timeout):
        judged = judge_index(
            image,
            runs,
            signer,
            trusted,
            out,
            attach_it=attach,
            insecure=insecure,
            require_complete=require_complete,
            notify=notifier(fmt is _app.Format.json),
            alert=alert,
            keyless=keyless,
        )
    if fmt is _app.Format.json:
        sys.stdout.write(serialize(judged.statement).decode() + "\n")
    else:
        console_attest.render_index(judged.statement, judged.folder)
        for done, referred in judged.attached:
            console_attest.render_attached(done, referred)
    raise typer.Exit(judged.code)


def _runs_trust(
    signer: "keys.SigningKey", given: "tuple[keys.PublicKey, ...]", who: Identity
) -> "tuple[tuple[keys.PublicKey, ...], keyless.Expected | None]":
    """What the runs an index combines must verify with: the keys given, the identity named
    (keyless), else the signer's own (a keyless signer: its identity, not this run's key)."""
    from imagegate.usecases.index import own_trust

    named = who.expected("keyless verification of the runs")
    if given or named:
        return given, named
    return own_trust(signer)
