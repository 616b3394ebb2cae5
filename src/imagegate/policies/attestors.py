"""`imagegate policies write --identity/--issuer --trusted-root`: the shipped policies with a
keyless attestor in place of the key, for statements `run --attach` signed keyless (Sigstore
bundle referrers, and `.att` layers in cosign's classic keyless form, each with a Fulcio
certificate naming the signer).

How each controller is told whom to trust, from its source at the versions the tests run:
- Kyverno's ClusterPolicy reads bundle referrers with `type: SigstoreBundle` and takes its
  trust material only from the TUF repository Kyverno was started with (the admission
  controller's --tufMirror/--tufRoot; the public Sigstore's by default): pkg/image/verifiers/
  cpol/cosign/sigstore.go, getTrustedRoot. The attestor still needs a Rekor URL (validation:
  "Either Rekor URL or roots are required"); the trusted root's log is named.
- Kyverno's ImageValidatingPolicy carries the trusted root inline (`cosign.trustedRoot`), and
  initialises TUF all the same (pkg/image/verifiers/ivpol/cosign/opts.go, initTUFAndFetch):
  `--tuf-mirror`/`--tuf-root` name the TUF repository it reads, else the public one.
- policy-controller's ClusterImagePolicy: a keyless authority whose `trustRootRef` names a
  TrustRoot (pkg/webhook/validator.go, checkOptsFromAuthority), written beside it, its
  `sigstoreKeys` converted from the trusted root (pkg/apis/config/sigstore_keys.go reads PEM,
  base64 in the resource). It reads the `.att` layers in cosign's classic keyless form with
  `rfc3161timestamp` (the certificate and a timestamp over the layer; no log then, and the
  keyless `url` must be set for it to read them at all) when the trusted root has a timestamp
  authority, else bundle referrers (`signatureFormat: bundle`)."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from imagegate._support.files import read_named
from imagegate._support.jsontypes import obj, objects, text
from imagegate.attest.keyless import MAX_TRUST_BYTES  # the bound of every trusted root read
from imagegate.errors import InternalError, UsageError
from imagegate.oci import untrusted_json

TRUST_ROOT_NAME = "imagegate-trust-root"
_HASHES = {"SHA2_256": "sha-256", "SHA2_384": "sha-384", "SHA2_512": "sha-512"}


@dataclass(frozen=True)
class Trust:
    """The parts of a trusted_root.json the policies carry."""

    document: str  # the trusted root, compact JSON (Kyverno's inline trustedRoot)
    rekor_url: str  # its first transparency log's base URL
    sigstore_keys: dict[str, object]  # policy-controller's TrustRoot spec.sigstoreKeys
    fulcio_url: str = ""  # its first certificate authority's URI
    timestamped: bool = False  # it names a timestamp authority


@dataclass(frozen=True)
class Signer:
    """Who must have signed (an exact value or a regexp each), and the Sigstore trusted."""

    identity: str | None
    identity_regexp: str | None
    issuer: str | None
    issuer_regexp: str | None
    trust: Trust
    tuf_mirror: str | None = None
    tuf_root: bytes | None = None

    def fields(self) -> list[tuple[str, str]]:
        """(name, value) as Kyverno's ClusterPolicy names them: subject/subjectRegExp, issuer/..."""
        pairs = (
            ("subject", self.identity),
            ("subjectRegExp", self.identity_regexp),
            ("issuer", self.issuer),
            ("issuerRegExp", self.issuer_regexp),
        )
        return [(k, v) for k, v in pairs if v is not None]


def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


def _authority(a: dict[str, object], where: str) -> dict[str, object]:
    certs = objects(obj(a.get("certChain")).get("certificates"))
    if not certs:
        raise ValueError(f"{where}: no certificate chain")
    chain = ""
    for c in certs:
        der = base64.b64decode(text(c.get("rawBytes")) or "", validate=True)
        cert = x509.load_der_x509_certificate(der)  # a certificate, or the file is refused
        chain += cert.public_bytes(serialization.Encoding.PEM).decode()
    subject = obj(a.get("subject"))
    return {
        "subject": {
            "organization": text(subject.get("organization")) or "",
            "commonName": text(subject.get("commonName")) or "",
        },
        "uri": text(a.get("uri")) or "",
        "certChain": _b64(chain),
    }


def _log(log: dict[str, object], where: str) -> dict[str, object]:
    key = obj(log.get("publicKey"))
    der = base64.b64decode(text(key.get("rawBytes")) or "", validate=True)
    pem = serialization.load_der_public_key(der).public_bytes(  # a public key, or refused
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    url = text(log.get("baseUrl"))
    if not url:
        raise ValueError(f"{where}: no baseUrl")
    algorithm = _HASHES.get(text(log.get("hashAlgorithm")) or "", "sha-256")
    return {"baseURL": url, "hashAlgorithm": algorithm, "publicKey": _b64(pem.decode())}


def read_trust(path: Path) -> Trust:
    """`--trusted-root FILE` (a trusted_root.json, or a client trust config's root), refused
    with the reason when it is not one."""
    raw = read_named(path, what="--trusted-root", max_bytes=MAX_TRUST_BYTES)
    try:
        doc = obj(untrusted_json.loads(raw, max_bytes=MAX_TRUST_BYTES))
        root = obj(doc["trustedRoot"]) if "trustedRoot" in doc else doc
        if not (text(root.get("mediaType")) or "").startswith(
            "application/vnd.dev.sigstore.trustedroot+json"
        ):
            raise ValueError("its mediaType is not application/vnd.dev.sigstore.trustedroot+json")
        cas = [
            _authority(a, f"certificateAuthorities[{n}]")
            for n, a in enumerate(objects(root.get("certificateAuthorities")))
        ]
        tlogs = [_log(t, f"tlogs[{n}]") for n, t in enumerate(objects(root.get("tlogs")))]
        if not cas or not tlogs:
            raise ValueError("it names no certificate authority or no transparency log")
        keys: dict[str, object] = {"certificateAuthorities": cas, "tLogs": tlogs}
        ctlogs = [_log(t, f"ctlogs[{n}]") for n, t in enumerate(objects(root.get("ctlogs")))]
        tsas = [
            _authority(a, f"timestampAuthorities[{n}]")
            for n, a in enumerate(objects(root.get("timestampAuthorities")))
        ]
        keys.update({k: v for k, v in (("ctLogs", ctlogs), ("timestampAuthorities", tsas)) if v})
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"--trusted-root {path}: not a Sigstore trusted root ({e})",
            hint="the trusted_root.json of the Sigstore that signs (cosign's --trusted-root file)",
        ) from None
    document = json.dumps(root, separators=(",", ":"))
    return Trust(document, str(tlogs[0]["baseURL"]), keys, str(cas[0]["uri"]), bool(tsas))


def _q(value: str) -> str:
    return json.dumps(value)  # a YAML double-quoted scalar: JSON's escapes are YAML's


_I = "\x00"  # the matched block's indent in a replacement: json.dumps never writes a NUL


def _sub(pattern: str, body: str, new: str, name: str) -> str:
    done, n = re.subn(pattern, lambda m: new.replace(_I, m.group("i")), body, flags=re.M)
    if n == 0:
        raise InternalError(f"shipped policy {name}: no key attestor to replace with a keyless one")
    return done


_KEY = r"-----BEGIN PUBLIC KEY-----\n *REPLACE WITH THE CONTENTS OF imagegate.pub\n *-----END PUBLIC KEY-----"


def _lines(pairs: list[tuple[str, str]], first: str, rest: str) -> str:
    """`key: "value"` lines, the first after `first`, the others after `rest` (indents)."""
    said = [f"{k}: {_q(v)}" for k, v in pairs]
    return first + said[0] + "".join(f"\n{rest}{line}" for line in said[1:])


def cluster_policy(body: str, s: Signer, name: str) -> str:
    """Kyverno's ClusterPolicy: each `keys` entry a `keyless` one, each verifyImages of type
    SigstoreBundle (the form keyless statements are attached in)."""
    keyless = _I + "- keyless:\n" + _lines(s.fields(), _I + "    ", _I + "    ")
    keyless += f"\n{_I}    rekor:\n{_I}      url: {_q(s.trust.rekor_url)}"
    pattern = rf"^(?P<i> *)- keys:\n *publicKeys: \|-\n *{_KEY}\n *rekor:\n *ignoreTlog: true\n *ctlog:\n *ignoreSCT: true$"
    body = _sub(pattern, body, keyless, name)
    kind = (
        f"{_I}type: SigstoreBundle  # keyless statements are Sigstore bundle referrers\n{_I}useCache: false"
    )
    return _sub(r"^(?P<i> *)useCache: false", body, kind, name)


def image_validating_policy(body: str, s: Signer, name: str) -> str:
    """Kyverno's ImageValidatingPolicy: a keyless cosign attestor with the trusted root inline."""
    new = f"{_I}cosign:\n{_I}  keyless:\n{_I}    identities:\n"
    new += _lines(s.fields(), _I + "      - ", _I + "        ")
    new += f"\n{_I}  trustedRoot:\n{_I}    value: {_q(s.trust.document)}"
    if s.tuf_mirror:
        new += f"\n{_I}  tuf:\n{_I}    mirror: {_q(s.tuf_mirror)}"
        if s.tuf_root is not None:
            new += f"\n{_I}    root:\n{_I}      data: {base64.b64encode(s.tuf_root).decode()}"
    pattern = rf"^(?P<i> *)cosign:\n *key:\n *data: \|-\n *{_KEY}\n *ctlog:\n *insecureIgnoreTlog: true\n *insecureIgnoreSCT: true$"
    body = _sub(pattern, body, new, name)
    return body.replace("signed by the imagegate key", "signed by the identity named here")


def cluster_image_policy(body: str, s: Signer, name: str) -> str:
    """policy-controller's ClusterImagePolicy: each key authority a keyless one, and the
    TrustRoot it names after it. With a timestamp authority in the trusted root, the authority
    reads the `.att` layers in cosign's classic keyless form (the certificate, a timestamp over the
    layer): policy-controller v0.13.1 reads bundles with sigstore-go v0.7.2, which refuses a Rekor
    v2 entry. Without one, it reads the bundle referrers (`signatureFormat: bundle`), which
    that version verifies only for a Rekor v1 log."""
    who = f"{_I}  identities:\n" + _lines(s.fields(), _I + "    - ", _I + "      ")
    ref = f"{_I}  trustRootRef: {TRUST_ROOT_NAME}"
    if s.trust.timestamped:
        new = f"{_I}keyless:\n{_I}  url: {_q(s.trust.fulcio_url)}\n{who}\n{ref}\n"
        new += f"{_I}rfc3161timestamp:  # the .att layers' timestamps: cosign's classic keyless form\n{ref}"
    else:
        new = f"{_I}signatureFormat: bundle  # keyless statements are Sigstore bundle referrers\n"
        new += f"{_I}keyless:\n{who}\n{ref}"
    pattern = rf"^(?P<i> *)key:\n *hashAlgorithm: sha256\n *data: \|\n *{_KEY}$"
    body = _sub(pattern, body, new, name)
    return body + "---\n" + trust_root(s.trust)


def trust_root(t: Trust) -> str:
    """policy-controller's TrustRoot for the trusted root (cluster-scoped, as the policy)."""
    doc = {
        "apiVersion": "policy.sigstore.dev/v1alpha1",
        "kind": "TrustRoot",
        "metadata": {"name": TRUST_ROOT_NAME},
        "spec": {"sigstoreKeys": t.sigstore_keys},
    }
    head = "# The Sigstore the keyless authorities above trust (imagegate policies write --trusted-root).\n"
    return head + json.dumps(doc, indent=2) + "\n"


def describe(s: Signer) -> str:
    who = s.identity or f"an identity matching /{s.identity_regexp}/"
    by = s.issuer or f"an issuer matching /{s.issuer_regexp}/"
    return f"{who} from {by}"
