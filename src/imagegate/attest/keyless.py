"""Keyless signing (Sigstore): no key to keep. The job's OIDC identity token buys a short-lived
Fulcio certificate for a key made for the run; each statement is signed with it, logged in the
transparency log (Rekor), timestamped by the timestamp authorities the signing config names,
and written as a Sigstore bundle v0.3 that carries the certificate, the log entry and the
timestamps. A verifier then checks *who* signed (the certificate's identity and issuer, from the
CI's workflow) against a trust root, not a public key file.

Named like the other signers, with `--key` or $IMAGEGATE_SIGNING_KEY:

    sigstore:FILE         a client trust config (Sigstore's ClientTrustConfig JSON: the trusted
                          root and the signing config; what `sigstore sign --trust-config` reads)
    sigstore:public-good  Sigstore's public instance (its trust fetched through TUF); by name only,
    sigstore:staging      never by default: its log publishes every digest and identity signed

The identity token: $SIGSTORE_ID_TOKEN (cosign's name; GitLab's `id_tokens` sets it), else the
CI's ambient credential (GitHub Actions with `id-token: write`, as sigstore-python detects it).
It is read before the run and a certificate is asked for then, so a missing or refused identity
fails before the work; a certificate that expires during a long run is asked for again, with a
token read again. Each bundle is verified, against the trust root and the identity the
certificate names, before it is handed on.

sigstore-python (the `keyless` extra) does the protocol: it is the Sigstore project's own client,
and Fulcio's, Rekor v2's and the TSA's exchanges plus the bundle's checks are thousands of lines.
Its HTTP requests carry no timeout and read answers whole, so while it works every request made
through `requests` is bounded here: by the command's deadline and a size cap."""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from imagegate._support import deadline
from imagegate._support.files import read_named
from imagegate._support.jsontypes import JsonMapping, JsonObject, freeze_object, items, obj, text
from imagegate._support.names import SIGSTORE_TOKEN_ENV
from imagegate.attest.publickeys import Algorithm, PublicKey
from imagegate.errors import UsageError, describe_exception
from imagegate.oci import untrusted_json

if TYPE_CHECKING:
    from sigstore.models import ClientTrustConfig, TrustedRoot
    from sigstore.oidc import IdentityToken
    from sigstore.sign import Signer

SCHEME = "sigstore:"
EXTRA = "imagegate[keyless]"
TOKEN_ENV = SIGSTORE_TOKEN_ENV
PUBLIC = {"public-good": "production", "staging": "staging"}
MAX_TRUST_BYTES = 4 << 20  # a trusted root with its keys and chains: tens of KiB
MAX_ANSWER_BYTES = 4 << 20  # a certificate chain, a log entry with its proof, a timestamp
TIMEOUT_S = 60.0  # one request; each also ends by the command's deadline
CONNECT_S = 10.0
RENEW_BEFORE = timedelta(seconds=60)  # a certificate this close to its end is not used
# Fulcio's OIDC issuer extensions: v2 (a DER UTF8String) and the first one (the raw string)
_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
_ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
_OTHERNAME_SAN = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.7")
# cosign's classic keyless proof on an `.att` layer (pkg/oci/static/signature.go)
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
RFC3161_ANNOTATION = "dev.sigstore.cosign/rfc3161timestamp"


def is_uri(value: str | os.PathLike[str] | None) -> bool:
    return value is not None and str(value).startswith(SCHEME)


def _sigstore(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            "keyless signing needs sigstore-python, which is not installed",
            hint=f"pip install '{EXTRA}' (or pipx inject imagegate sigstore)",
        ) from None


def trust_config(uri: str) -> ClientTrustConfig:
    """The trusted root and signing config a `sigstore:` reference names."""
    name = str(uri).removeprefix(SCHEME)
    models = _sigstore("sigstore.models")
    if not name:
        raise UsageError(
            f"{uri}: names no Sigstore",
            hint="sigstore:FILE (a client trust config), or sigstore:public-good / sigstore:staging by name",
        )
    if name in PUBLIC:
        try:
            with _bounded(f"Sigstore's {name} trust (TUF)"):
                config: ClientTrustConfig = getattr(models.ClientTrustConfig, PUBLIC[name])()
        except UsageError:
            raise
        except Exception as e:  # TUF's errors, the network's: the message says which
            raise UsageError(f"{uri}: its trust could not be read ({describe_exception(e)})") from None
        return config
    path = Path(name).expanduser()
    data = read_named(path, what="Sigstore trust config", max_bytes=MAX_TRUST_BYTES)
    try:
        doc = untrusted_json.loads(data, max_bytes=MAX_TRUST_BYTES)  # nesting and size before a parser
        parsed: ClientTrustConfig = models.ClientTrustConfig.from_json(data.decode())
        parsed.trusted_root  # noqa: B018 — its media type and form are checked when it is read
        parsed.signing_config  # noqa: B018
    except Exception as e:  # pydantic's, sigstore's, JSON's: one message naming the file
        raise UsageError(
            f"Sigstore trust config {path}: not a client trust config ({_first_line(e)})",
            hint="a ClientTrustConfig JSON (mediaType application/vnd.dev.sigstore.clienttrustconfig.v0.1+json) "
            "holding trustedRoot and signingConfig",
        ) from None
    _check_services(path, doc)
    return parsed


def _check_services(path: Path, doc: object) -> None:
    """The identity token goes to Fulcio, the statements to the log and the TSA: over TLS, or
    plain HTTP to this machine only (elsewhere the token would cross the network in clear)."""
    from imagegate.oci.reference import is_loopback_registry

    config = obj(obj(doc).get("signingConfig"))
    for kind in ("caUrls", "oidcUrls", "rekorTlogUrls", "tsaUrls"):
        for service in items(config.get(kind)):
            url = urllib.parse.urlsplit(text(obj(service).get("url")) or "")
            if url.scheme == "https" or (url.scheme == "http" and is_loopback_registry(url.hostname or "")):
                continue
            raise UsageError(
                f"Sigstore trust config {path}: {kind} names {url.geturl()!r}: plain HTTP to another machine "
                "would send the identity token and the statements in clear",
                hint="https:// for every service; http:// is for 127.0.0.1 or localhost",
            )


def trusted_root(path: Path) -> TrustedRoot:
    """`verify --trusted-root FILE`: a trusted root (trusted_root.json, as cosign reads it), or
    a client trust config's root."""
    models = _sigstore("sigstore.models")
    data = read_named(path, what="trusted root", max_bytes=MAX_TRUST_BYTES)
    try:
        doc = obj(untrusted_json.loads(data, max_bytes=MAX_TRUST_BYTES))
        if "trustedRoot" in doc:
            root: TrustedRoot = models.ClientTrustConfig.from_json(data.decode()).trusted_root
            return root
        return models.TrustedRoot(_trustroot_v1().TrustedRoot.from_json(data))  # type: ignore[no-any-return]
    except Exception as e:
        raise UsageError(
            f"trusted root {path}: not a Sigstore trusted root ({_first_line(e)})",
            hint="the trusted_root.json of the Sigstore that signed (cosign's --trusted-root file)",
        ) from None


def _trustroot_v1() -> ModuleType:
    return importlib.import_module("sigstore_models.trustroot.v1")


def _first_line(e: BaseException) -> str:
    said = describe_exception(e).strip().splitlines()
    return said[0][:300] if said else type(e).__name__


def identity_token(env: Mapping[str, str]) -> IdentityToken:
    """$SIGSTORE_ID_TOKEN, else the CI's ambient credential, checked for its form and lifetime
    (Fulcio checks its signature). Never printed."""
    oidc = _sigstore("sigstore.oidc")
    raw = env.get(TOKEN_ENV, "").strip()
    source = f"${TOKEN_ENV}"
    if not raw:
        try:
            with _bounded("the CI's identity token"):
                raw = oidc.detect_credential() or ""
        except oidc.IdentityError as e:
            raise UsageError(
                f"keyless signing: the CI's identity token could not be had ({_first_line(e)})"
            ) from None
        source = "the CI's ambient credential"
    if not raw:
        raise UsageError(
            "keyless signing needs an identity token, and there is none",
            hint=f"set {TOKEN_ENV} (GitLab: id_tokens with aud: sigstore), or give the job "
            "`permissions: id-token: write` on GitHub Actions; or sign with a key",
        )
    try:
        token: IdentityToken = oidc.IdentityToken(raw)
    except oidc.IdentityError as e:
        raise UsageError(
            f"keyless signing: the identity token from {source} is refused ({_first_line(e)})",
            hint="an OIDC token for the audience 'sigstore', not expired",
        ) from None
    return token


@dataclass(frozen=True)
class Identity:
    """Who a certificate says signed: its subject alternative name and OIDC issuer."""

    identity: str
    issuer: str

    def __str__(self) -> str:
        return f"{self.identity} (issuer {self.issuer})"


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity Fulcio wrote in `cert`: its one SAN (an email, a URI, or Sigstore's
    other-name), and its issuer extension (v2, else v1)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise UsageError("the signing certificate names no identity (no subject alternative name)") from None
    names = [
        *san.get_values_for_type(x509.RFC822Name),
        *san.get_values_for_type(x509.UniformResourceIdentifier),
        # Sigstore's other-name (a username): its value a DER UTF8String
        *(
            _utf8_string(o.value)
            for o in san.get_values_for_type(x509.OtherName)
            if o.type_id == _OTHERNAME_SAN
        ),
    ]
    issuer = ""
    for oid, der in ((_ISSUER_V2, True), (_ISSUER_V1, False)):
        with contextlib.suppress(x509.ExtensionNotFound):
            value = cert.extensions.get_extension_for_oid(oid).value
            raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
            issuer = _utf8_string(raw) if der else raw.decode(errors="replace")
            break
    if len(names) != 1 or not issuer:
        raise UsageError(
            f"the signing certificate does not name one identity and its issuer ({names}, {issuer!r})"
        )
    return Identity(names[0], issuer)


def _utf8_string(der: bytes) -> str:
    """A DER UTF8String's text (tag 0x0c, a short or long length)."""
    if len(der) < 2 or der[0] != 0x0C:
        return ""
    n, at = der[1], 2
    if n & 0x80:
        width = n & 0x7F
        n, at = int.from_bytes(der[2 : 2 + width], "big"), 2 + width
    return der[at : at + n].decode(errors="replace")


def certificate_of(material: JsonMapping) -> x509.Certificate | None:
    """The signing certificate of a bundle's verificationMaterial (v0.3's `certificate`, the
    form signing writes); None when it holds none that parses."""
    raw = text(obj(material.get("certificate")).get("rawBytes")) or ""
    try:
        return x509.load_der_x509_certificate(base64.b64decode(raw))
    except ValueError:
        return None


@dataclass
class KeylessKey:
    """A signer of the SigningKey kind whose key lives as long as its certificate: `seal` signs a
    statement and returns it with its bundle's verification material (certificate, log entry,
    timestamps), each checked before it is handed on."""

    uri: str
    config: ClientTrustConfig = field(repr=False)
    token: Callable[[], IdentityToken] = field(repr=False)
    _signer: Signer | None = field(default=None, repr=False)
    _cert: x509.Certificate | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    path: Path | None = None
    secret_file: Path | None = None

    @property
    def algorithm(self) -> Algorithm:
        return "ecdsa-p256"

    @property
    def where(self) -> str:
        return self.uri

    @property
    def public(self) -> PublicKey:
        """The key of the current certificate (made for this run: it identifies nobody; the
        certificate's identity does)."""
        key = self._certificate().public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        return PublicKey(key)

    @property
    def identity(self) -> Identity:
        """Who the current certificate names (the first read asks Fulcio for it)."""
        return identity_of(self._certificate())

    def _certificate(self) -> x509.Certificate:
        with self._lock:
            now = datetime.now(timezone.utc)
            if self._cert is None or self._cert.not_valid_after_utc - RENEW_BEFORE <= now:
                self._signer, self._cert = self._new_signer()
            return self._cert

    def _new_signer(self) -> tuple[Signer, x509.Certificate]:
        sign = _sigstore("sigstore.sign")
        token = self.token()
        with (
            _failing(
                f"{self.uri}: Fulcio refused a certificate for {token.identity} (issuer {token.issuer})"
            ),
            _bounded("Fulcio's certificate"),
        ):
            context = sign.SigningContext.from_trust_config(self.config)
            signer: Signer = sign.Signer(token, context, cache=True)  # asks Fulcio now
            # the certificate it holds (a private call: sigstore is pinned, and a test reads
            # the identity of what it signed)
            cert: x509.Certificate = signer._signing_cert()
        return signer, cert

    def sign(self, data: bytes) -> bytes:
        raise UsageError(
            f"{self.uri}: a keyless signature is only good with its certificate and log entry, "
            "and this command writes a bare signature",
            hint="sign this with a key (--key PATH, pkcs11:, hashivault://)",
        )

    def seal(self, payload: bytes) -> JsonObject:
        """`payload` (an in-toto statement's bytes, signed as they are) in a DSSE envelope,
        as the Sigstore bundle that carries it (its JSON)."""
        sdsse = _sigstore("sigstore.dsse")
        self._certificate()  # a fresh one when the run outlived the last
        assert self._signer is not None
        with (
            _failing(f"{self.uri}: the statement could not be signed keyless"),
            _bounded("Rekor and the TSA"),
        ):
            made = self._signer.sign_dsse(sdsse.Statement(payload))
        written = freeze_object(obj(json.loads(made.to_json())))
        who = identity_of(made.signing_certificate)
        # Checked as `verify` checks it (the trust root, the log entry, a time from the TSA or
        # the log, the certificate's identity, the bytes signed): a bundle that fails is never written.
        expected = Expected(self.config.trusted_root, identity=who.identity, issuer=who.issuer)
        ptype = text(obj(written.get("dsseEnvelope")).get("payloadType")) or ""
        certified, why = expected.verified_key(written, ptype, payload)
        if certified is None:
            raise UsageError(f"{self.uri}: the signed statement does not verify with its trust root ({why})")
        return written

    def stamp(self, data: bytes, material: JsonMapping) -> dict[str, str] | None:
        """cosign's classic keyless proof for an `.att` layer of bytes `data` whose bundle's
        verificationMaterial is `material`: the signing certificate (PEM) and an RFC 3161
        timestamp over the layer's bytes (for an attestation cosign timestamps the payload it
        reads, the whole envelope: verify.go, VerifyRFC3161Timestamp), checked against the
        trusted root and inside the certificate's validity. Asked of the signing config's first
        timestamp authority (any serves: the answer is checked against the trusted root). None
        when it names none, or `material` holds no certificate: the classic form then has no
        proof a reader without the log takes."""
        cert = certificate_of(material)
        self._certificate()
        assert self._signer is not None
        tsas = self._signer._signing_ctx._tsa_clients  # a private attribute: sigstore is pinned
        if cert is None or not tsas:
            return None
        verify = _sigstore("sigstore.verify")
        tsa = tsas[0]
        with _failing(f"{self.uri}: the timestamp authority {tsa.url}"), _bounded("the TSA"):
            answer = tsa.request_timestamp(data)
            checked = verify.Verifier(trusted_root=self.config.trusted_root)._verify_signed_timestamp(
                answer, data
            )
        if checked is None or not cert.not_valid_before_utc <= checked.time <= cert.not_valid_after_utc:
            raise UsageError(
                f"{self.uri}: the timestamp authority's answer does not verify with the trusted root "
                "inside the signing certificate's validity; nothing attached"
            )
        return {
            CERTIFICATE_ANNOTATION: cert.public_bytes(serialization.Encoding.PEM).decode(),
            RFC3161_ANNOTATION: json.dumps(
                {"SignedRFC3161Timestamp": base64.b64encode(answer.as_bytes()).decode()},
                separators=(",", ":"),
            ),
        }

    def expected(self) -> Expected:
        """Who signs, as a reader checks it: an attach supersedes only what this proves."""
        who = self.identity
        return Expected(self.config.trusted_root, identity=who.identity, issuer=who.issuer)

    def __repr__(self) -> str:
        return f"KeylessKey({self.uri})"


def open_key(uri: str, env: Mapping[str, str]) -> KeylessKey:
    """The keyless signer a `sigstore:` reference names, with a certificate for the identity
    the token proves: a bad trust config, no token or a refused one fail now."""
    config = trust_config(uri)
    key = KeylessKey(str(uri), config, lambda: identity_token(env))
    key.identity  # noqa: B018 — the token read and Fulcio asked now: a refusal comes before the work
    return key


@contextlib.contextmanager
def _failing(what: str) -> Iterator[None]:
    """sigstore-python's errors (its own, requests', cryptography's) as one message naming the
    step; an interrupt or the deadline as themselves."""
    try:
        yield
    except (UsageError, KeyboardInterrupt, deadline.DeadlineReached):
        raise
    except Exception as e:
        diagnostics = getattr(e, "diagnostics", None)
        said = _first_line(e)
        if callable(diagnostics):
            with contextlib.suppress(Exception):
                said = " ".join(str(diagnostics()).split())[:400] or said
        raise deadline.expired_error(what) or UsageError(f"{what} ({said})") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without the warnings sigstore-python's checks let through (cryptography's about a
    certificate's attributes): what matters is what the check concludes, said by the caller."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_BOUND = threading.local()


@contextlib.contextmanager
def _bounded(what: str) -> Iterator[None]:
    """Every request `requests` sends from this thread meanwhile: a connect and read timeout
    ending by the command's deadline, its answer read up to MAX_ANSWER_BYTES."""
    import requests.adapters

    adapter = requests.adapters.HTTPAdapter
    if not getattr(adapter.send, "_imagegate_bounded", False):
        original = adapter.send

        def send(
            self: requests.adapters.HTTPAdapter,
            request: requests.PreparedRequest,
            *args: object,
            **kwargs: object,
        ) -> requests.Response:
            if getattr(_BOUND, "what", None) is None:
                return original(self, request, *args, **kwargs)  # type: ignore[arg-type]
            whole = deadline.cap(TIMEOUT_S) or TIMEOUT_S  # the request, its answer read whole
            end = time.monotonic() + whole
            kwargs["timeout"] = (deadline.cap(CONNECT_S), whole)
            kwargs["stream"] = True
            resp = original(self, request, *args, **kwargs)  # type: ignore[arg-type]
            body = bytearray()
            try:
                # chunk by chunk, as they come: a server that trickles is cut at the deadline
                while chunk := resp.raw.read1(1 << 16, decode_content=True):
                    body += chunk
                    deadline.check(f"{_BOUND.what}: the answer of {request.url}")
                    if time.monotonic() > end:
                        raise UsageError(
                            f"{_BOUND.what}: {request.url} did not answer whole within {whole:.0f} s"
                        )
                    if len(body) > MAX_ANSWER_BYTES:
                        raise UsageError(
                            f"{_BOUND.what}: {request.url} answered over {MAX_ANSWER_BYTES >> 20} MiB"
                        )
            finally:
                resp.close()
            resp._content, resp._content_consumed = bytes(body), True
            return resp

        send._imagegate_bounded = True  # type: ignore[attr-defined]
        adapter.send = send  # type: ignore[method-assign]
    before = getattr(_BOUND, "what", None)
    _BOUND.what = what
    try:
        with deadline.waiting(what), _quiet():
            yield
    finally:
        _BOUND.what = before


def describe(key: KeylessKey) -> str:
    return f"keyless, as {key.identity}"


@dataclass(frozen=True)
class Expected:
    """`verify --identity/--identity-regexp --issuer/--issuer-regexp --trusted-root`: who must
    have signed, and the Sigstore whose CA, logs and timestamp authorities are trusted. A
    regexp matches anywhere in the value, as cosign's --certificate-identity-regexp does (Go's
    MatchString): anchor it (^…$) to match the whole."""

    root: TrustedRoot = field(repr=False)
    identity: str | None = None
    identity_regexp: str | None = None
    issuer: str | None = None
    issuer_regexp: str | None = None

    def __str__(self) -> str:
        who = self.identity or f"an identity matching /{self.identity_regexp}/"
        by = self.issuer or f"an issuer matching /{self.issuer_regexp}/"
        return f"{who} from {by}"

    def matches(self, who: Identity) -> bool:
        import re

        def one(value: str, exact: str | None, pattern: str | None) -> bool:
            return value == exact if exact is not None else bool(pattern and re.search(pattern, value))

        return one(who.identity, self.identity, self.identity_regexp) and one(
            who.issuer, self.issuer, self.issuer_regexp
        )

    def verified_key(
        self, bundle: JsonObject, payload_type: str, payload: bytes
    ) -> tuple[PublicKey | None, str]:
        """The key of the certificate that signed `payload` in `bundle` (a Sigstore bundle's
        JSON), when the bundle proves it (the certificate chains to the trusted root's CA at a
        time a timestamp authority or the log vouches for, its SCT, its log entry and
        inclusion, the identity expected); else None and why."""
        material = obj(bundle.get("verificationMaterial"))
        if not ({"certificate", "x509CertificateChain"} & set(material)):
            return (
                None,
                "no certificate beside the envelope (not signed keyless, or its .sigstore.json is not beside it)",
            )
        models, verify, errors = (
            _sigstore(m) for m in ("sigstore.models", "sigstore.verify", "sigstore.errors")
        )
        expected = self

        class _Policy:
            def verify(self, cert: x509.Certificate) -> None:
                who = identity_of(cert)
                if not expected.matches(who):
                    raise errors.VerificationError(f"signed by {who}, not {expected}")

        try:
            with _quiet():
                made = models.Bundle.from_json(json.dumps(bundle))
                ptype, signed = verify.Verifier(trusted_root=self.root).verify_dsse(made, _Policy())
            cert = made.signing_certificate
        except UsageError as e:
            return None, str(e)
        except Exception as e:  # sigstore's VerificationError, a malformed bundle
            return None, _first_line(e)
        if (ptype, signed) != (payload_type, payload):
            return None, "the bundle's log entry signs other bytes than the envelope"
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        return PublicKey(key), f"keyless, as {identity_of(cert)} (certificate, log entry and time checked)"
