"""A Sigstore of the tests' own on 127.0.0.1, for keyless signing (issue 52): nothing public is
reached. `local_sigstore()` starts, each on a free port and in a folder of its own:

- the OIDC stand-in of GitHub Actions and GitLab CI (tests/attest/oidc_standin.py, a thread here);
- Fulcio (`fulcio serve --ca ephemeralca`), its CA made in memory when it starts, trusting only
  the stand-in's two issuers (a config file of ours: with none, Fulcio would trust its public
  defaults);
- the CT log Fulcio submits each precertificate to (RFC 6962 add-pre-chain), TesseraCT on POSIX
  storage, which accepts chains up to Fulcio's root only: the certificate carries its SCT;
- Rekor v2 (rekor-tiles on POSIX storage) and the timestamp authority (in-memory signer);

then writes trusted_root.json (Fulcio's chain, the CT log's and Rekor's keys and IDs, the TSA's
chain), signing_config.json (v0.2: the URLs to sign with) and client_trust_config.json (both, as
sigstore-python's `ClientTrustConfig.from_json` reads them). The binaries are built by
scripts/consumers.py (tools `sigstore` and `tesseract`). Each process runs in its own session
and is killed, and every folder removed, when the block ends, however it ends (SIGINT too).

Fulcio's certificates live 10 minutes (pkg/ca/common.go, v1.8.8; no flag changes it), and Rekor v2
gives no time of its own: the TSA's is the only one a verifier checks the certificate at. A
certificate used outside its validity is had in seconds, not 10 minutes, the other way round:
`bundle_stamped_before_its_certificate` has the signature timestamped before Fulcio issues the
certificate. A token minted to have expired (`token(expires_in=-60)`) gets no certificate.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sigstore import dsse
from sigstore.models import Bundle, ClientTrustConfig
from sigstore.oidc import IdentityToken
from sigstore.sign import SigningContext

from tests.attest.conftest import free_port
from tests.attest.oidc_standin import AUDIENCE, Issuers, Kind, oidc_standin

START_SECONDS = 90  # each server's start, on a loaded 2-core machine
STOP_SECONDS = 10
# The timestamp authority serves its metrics on :2112, every address, whatever its flags say
# (pkg/server/prometheus.go, v2.1.3), and exits if it cannot: one local Sigstore at a time per
# machine, the others waiting their turn on this lock.
TSA_METRICS_PORT = 2112
LOCK = Path(tempfile.gettempdir()) / "imagegate-sigstore-local.lock"
TRUSTED_ROOT_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
SIGNING_CONFIG_TYPE = "application/vnd.dev.sigstore.signingconfig.v0.2+json"
CLIENT_TRUST_CONFIG_TYPE = "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json"
OPERATOR = "imagegate-tests"
# The logs' checkpoint origins: the host of each one's URL. TesseraCT takes no host:port (it must
# parse as a URL without a scheme) and warns of a submission whose URL, less its port, does not
# start with its origin; sigstore-go (cosign) checks a Rekor v2 checkpoint's note under the host of
# the log's URL in the trusted root (pkg/verify/tlog.go, v1.2.2); sigstore-python does not.
CT_ORIGIN = REKOR_ORIGIN = "127.0.0.1"


class StartError(RuntimeError):
    """A server of the local Sigstore did not start: its name, why, and its log's end."""


@dataclass(frozen=True)
class LocalSigstore:
    folder: Path  # trusted_root.json, signing_config.json, client_trust_config.json
    issuers: Issuers
    fulcio: str
    ct_log: str
    rekor: str
    tsa: str
    started_seconds: dict[str, float]  # each server's start, up to its first good answer

    @property
    def trusted_root(self) -> Path:
        return self.folder / "trusted_root.json"

    @property
    def signing_config(self) -> Path:
        return self.folder / "signing_config.json"

    @property
    def client_trust_config(self) -> Path:
        return self.folder / "client_trust_config.json"

    def issuer(self, kind: Kind = "github") -> str:
        return self.issuers.issuer(kind)

    @property
    def token(self) -> Callable[..., str]:
        """The stand-in's minter: token(sub, kind="github"|"gitlab", *, ref, expires_in, claims)
        (oidc_standin.Issuers.token)."""
        return self.issuers.token

    def identity(
        self, sub: str = "imagegate-test/app", kind: Kind = "github", ref: str = "refs/heads/main"
    ) -> str:
        """The certificate's SAN Fulcio writes for such a token (the templates of fulcio_config)."""
        if kind == "github":
            return f"https://github.com/{sub}/.github/workflows/release.yml@{ref}"
        return f"https://gitlab.com/{sub}//.gitlab-ci.yml@{ref}"


# Fulcio's issuers: the stand-in's two, as Fulcio's own config/identity/config.yaml types GitHub's
# and GitLab's (ci-provider), with the certificate extensions a verifier reads filled from the claims.
GITHUB_EXTENSIONS = {
    "GithubWorkflowTrigger": "event_name",
    "GithubWorkflowSHA": "sha",
    "GithubWorkflowName": "workflow",
    "GithubWorkflowRepository": "repository",
    "GithubWorkflowRef": "ref",
    "BuildSignerURI": "{{ .url }}/{{ .job_workflow_ref }}",
    "BuildSignerDigest": "job_workflow_sha",
    "RunnerEnvironment": "runner_environment",
    "SourceRepositoryURI": "{{ .url }}/{{ .repository }}",
    "SourceRepositoryDigest": "sha",
    "SourceRepositoryRef": "ref",
    "SourceRepositoryIdentifier": "repository_id",
    "SourceRepositoryOwnerURI": "{{ .url }}/{{ .repository_owner }}",
    "SourceRepositoryOwnerIdentifier": "repository_owner_id",
    "BuildConfigURI": "{{ .url }}/{{ .workflow_ref }}",
    "BuildConfigDigest": "workflow_sha",
    "BuildTrigger": "event_name",
    "RunInvocationURI": "{{ .url }}/{{ .repository }}/actions/runs/{{ .run_id }}/attempts/{{ .run_attempt }}",
    "SourceRepositoryVisibilityAtSigning": "repository_visibility",
}
GITLAB_EXTENSIONS = {
    "BuildSignerURI": "https://{{ .ci_config_ref_uri }}",
    "BuildSignerDigest": "ci_config_sha",
    "RunnerEnvironment": "runner_environment",
    "SourceRepositoryURI": "{{ .url }}/{{ .project_path }}",
    "SourceRepositoryDigest": "sha",
    "SourceRepositoryRef": 'refs/{{if eq .ref_type "branch"}}heads/{{ else }}tags/{{end}}{{ .ref }}',
    "SourceRepositoryIdentifier": "project_id",
    "SourceRepositoryOwnerURI": "{{ .url }}/{{ .namespace_path }}",
    "SourceRepositoryOwnerIdentifier": "namespace_id",
    "BuildConfigURI": "https://{{ .ci_config_ref_uri }}",
    "BuildConfigDigest": "ci_config_sha",
    "BuildTrigger": "pipeline_source",
    "RunInvocationURI": "{{ .url }}/{{ .project_path }}/-/jobs/{{ .job_id }}",
    "SourceRepositoryVisibilityAtSigning": "project_visibility",
}


def fulcio_config(issuers: Issuers, kubernetes: str | None = None) -> dict[str, object]:
    """Fulcio's config (its JSON form, pkg/config/config.go): the stand-in's issuers, and a
    cluster's service-account issuer (`kubernetes`, its URL) where one is given: Fulcio's
    `kubernetes` type names a token's ServiceAccount (pkg/identity/kubernetes/principal.go)."""
    cluster = {kubernetes: {"IssuerURL": kubernetes, "ClientID": AUDIENCE, "Type": "kubernetes"}}
    return {
        "OIDCIssuers": {
            **{
                issuers.issuer(kind): {
                    "IssuerURL": issuers.issuer(kind),
                    "ClientID": AUDIENCE,
                    "Type": "ci-provider",
                    "CIProvider": f"{kind}-stand-in",
                }
                for kind in ("github", "gitlab")
            },
            **(cluster if kubernetes else {}),
        },
        "CIIssuerMetadata": {
            "github-stand-in": {
                "DefaultTemplateValues": {"url": "https://github.com", "environment": ""},
                "ExtensionTemplates": GITHUB_EXTENSIONS,
                "SubjectAlternativeNameTemplate": "{{ .url }}/{{ .job_workflow_ref }}",
            },
            "gitlab-stand-in": {
                "DefaultTemplateValues": {"url": "https://gitlab.com", "environment": ""},
                "ExtensionTemplates": GITLAB_EXTENSIONS,
                "SubjectAlternativeNameTemplate": "https://{{ .ci_config_ref_uri }}",
            },
        },
    }


@dataclass
class _Processes:
    """The servers started so far, each in its own session, and their folders."""

    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path

    def log(self, name: str) -> Path:
        return self.root / name / "server.log"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        folder = self.root / name
        # Killed by the kernel too if this process dies without its `finally` (SIGKILL, a crash):
        # util-linux's setpriv sets the parent-death signal, and the server keeps it across exec.
        setpriv = shutil.which("setpriv")
        guard = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        with self.log(name).open("wb") as log:
            self.procs[name] = subprocess.Popen(
                [*guard, *argv], cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", ""), "HOME": str(folder), **(env or {})},
                start_new_session=True,
            )  # fmt: skip

    def fail(self, name: str, why: str) -> StartError:
        tail = self.log(name).read_text(errors="replace")[-3000:] if self.log(name).exists() else ""
        return StartError(f"{name} did not start: {why}\n--- {name}'s log (end) ---\n{tail}")

    def wait(self, name: str, ready: Callable[[float], bool], seconds: float = START_SECONDS) -> float:
        """Seconds until `ready(timeout)` holds; StartError once the process exits or the deadline
        passes. Every attempt's own timeout ends within the deadline."""
        start = time.monotonic()
        end = start + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise self.fail(name, f"no good answer within {seconds:.0f} s")
            code = self.procs[name].poll()
            if code is not None:
                raise self.fail(name, f"it exited with status {code}")
            with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
                if ready(min(2.0, left)):
                    return round(time.monotonic() - start, 2)
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_SECONDS)


def _get_ok(url: str) -> Callable[[float], bool]:
    return lambda timeout: httpx.get(url, timeout=timeout).status_code == 200


def _ec_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """A new P-256 key, written as SEC 1 PEM (TesseraCT reads only that; Rekor reads it too)."""
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return key


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _pem_chain(text: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(text.encode())


@contextlib.contextmanager
def _machine_lock(seconds: float = 1800) -> Iterator[None]:
    """One local Sigstore per machine at a time (the TSA's fixed metrics port); bounded wait. A
    module holds it while its tests run (tests/attest/test_keyless_sigstore.py's take minutes on a
    loaded 2-core machine; tests/kube/test_admission_keyless.py's and test_sigstore_local.py's
    modules wait their turn in other workers), so the bound is a whole module's, not a start's."""
    with LOCK.open("a") as f:
        end = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > end:
                    raise StartError(f"another local Sigstore held {LOCK} for {seconds:.0f} s") from e
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _start_fulcio(
    p: _Processes, exe: str, issuers: Issuers, ct_url: str, ct_pub: Path, cluster: Cluster | None
) -> tuple[str, list[x509.Certificate], float]:
    folder = p.folder("fulcio")
    config = fulcio_config(issuers, cluster.issuer if cluster else None)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    # Separate HTTP and gRPC ports, as Fulcio's docker-compose.yml runs it: on one port (its
    # "duplex" server) v1.8.8 panics at start, registering gRPC metrics twice (grpc_server_started_total).
    port, grpc, metrics = free_port(), free_port(), free_port()
    p.start("fulcio", [
        exe, "serve", "--ca", "ephemeralca", "--config-path", str(folder / "config.json"),
        "--host", "127.0.0.1", "--port", str(port), "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc),
        "--metrics-port", str(metrics), "--legacy-unix-domain-socket", str(folder / "legacy.sock"),
        "--ct-log-url", ct_url, "--ct-log-public-key-path", str(ct_pub), "--log_type", "dev",
    ], env={"SSL_CERT_FILE": str(cluster.ca)} if cluster else None)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    chain: list[x509.Certificate] = []

    def ready(timeout: float) -> bool:
        r = httpx.get(f"{url}/api/v2/trustBundle", timeout=timeout)
        if r.status_code != 200:
            return False
        chain[:] = _pem_chain("".join(r.json()["chains"][0]["certificates"]))
        return bool(chain)

    return url, chain, p.wait("fulcio", ready)


def _start_ct_log(p: _Processes, exe: str, port: int, roots: list[x509.Certificate], key: Path) -> float:
    folder = p.folder("ct-log")
    (folder / "roots.pem").write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in roots))
    (folder / "storage").mkdir()
    p.start("ct-log", [
        exe, "--http_endpoint", f"127.0.0.1:{port}", "--origin", CT_ORIGIN,
        "--storage_dir", str(folder / "storage"), "--private_key", str(key),
        "--roots_pem_file", str(folder / "roots.pem"), "--ext_key_usages", "CodeSigning",
        "--checkpoint_interval", "500ms", "--accept_sha1_signing_algorithms=false",
    ], env={"OTEL_METRIC_EXPORT_INTERVAL": str(24 * 3600 * 1000)})  # fmt: skip
    return p.wait("ct-log", _get_ok(f"http://127.0.0.1:{port}/healthz"))


def _start_rekor(p: _Processes, exe: str, origin: str) -> tuple[str, ec.EllipticCurvePrivateKey, float]:
    folder = p.folder("rekor")
    key = _ec_key(folder / "signer.pem")
    (folder / "storage").mkdir()
    port, grpc, metrics = free_port(), free_port(), free_port()
    p.start("rekor", [
        exe, "serve", "--hostname", origin, "--storage-dir", str(folder / "storage"),
        "--signer-filepath", str(folder / "signer.pem"),
        "--http-address", "127.0.0.1", "--http-port", str(port), "--grpc-address", "127.0.0.1",
        "--grpc-port", str(grpc), "--http-metrics-port", str(metrics), "--checkpoint-interval", "500ms",
    ])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return url, key, p.wait("rekor", _get_ok(f"{url}/healthz"))


def _start_tsa(p: _Processes, exe: str) -> tuple[str, list[x509.Certificate], float]:
    p.folder("tsa")
    if not _port_free(TSA_METRICS_PORT):
        raise StartError(
            f"the timestamp authority needs port {TSA_METRICS_PORT} (its metrics), held by another program"
        )
    port = free_port()
    p.start("tsa", [
        exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--timestamp-signer", "memory",
        "--disable-ntp-monitoring", "--log-type", "dev",
    ])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    chain: list[x509.Certificate] = []

    def ready(timeout: float) -> bool:
        r = httpx.get(f"{url}/api/v1/timestamp/certchain", timeout=timeout)
        chain[:] = _pem_chain(r.text) if r.status_code == 200 else []
        return bool(chain)

    return url, chain, p.wait("tsa", ready)


def _log(url: str, spki: bytes, log_id: bytes, since: str) -> dict[str, object]:
    return {
        "baseUrl": url,
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": _b64(spki),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": since},
        },
        "logId": {"keyId": _b64(log_id)},
        "operator": OPERATOR,
    }


def _authority(url: str, chain: list[x509.Certificate], since: str) -> dict[str, object]:
    with warnings.catch_warnings():  # Fulcio's ephemeral root says C=USA, three letters
        warnings.simplefilter("ignore", UserWarning)
        subject = chain[-1].subject
    org = [a.value for a in subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)]
    cn = [a.value for a in subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    return {
        "subject": {"organization": str(org[0]) if org else "", "commonName": str(cn[0]) if cn else ""},
        "uri": url,
        "certChain": {
            "certificates": [{"rawBytes": _b64(c.public_bytes(serialization.Encoding.DER))} for c in chain]
        },
        "validFor": {"start": since},
        "operator": OPERATOR,
    }


def trust_files(
    s: LocalSigstore,
    fulcio_chain: list[x509.Certificate],
    ct_spki: bytes,
    rekor_spki: bytes,
    tsa_chain: list[x509.Certificate],
) -> None:
    """trusted_root.json, signing_config.json and client_trust_config.json into s.folder."""
    since = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # A P-256 key's ID is the SHA-256 of its SubjectPublicKeyInfo for the CT log (RFC 6962) and for
    # Rekor v2 alike (rekor-tiles pkg/note: KeyHash, ECDSA keys).
    root = {
        "mediaType": TRUSTED_ROOT_TYPE,
        "tlogs": [_log(s.rekor, rekor_spki, hashlib.sha256(rekor_spki).digest(), since)],
        "certificateAuthorities": [_authority(s.fulcio, fulcio_chain, since)],
        "ctlogs": [_log(s.ct_log, ct_spki, hashlib.sha256(ct_spki).digest(), since)],
        "timestampAuthorities": [_authority(f"{s.tsa}/api/v1/timestamp", tsa_chain, since)],
    }

    def service(url: str, version: int) -> dict[str, object]:
        return {"url": url, "majorApiVersion": version, "validFor": {"start": since}, "operator": OPERATOR}

    config = {
        "mediaType": SIGNING_CONFIG_TYPE,
        "caUrls": [service(s.fulcio, 1)],
        "oidcUrls": [service(s.issuer("github"), 1)],
        "rekorTlogUrls": [service(s.rekor, 2)],
        "rekorTlogConfig": {"selector": "ANY"},
        "tsaUrls": [service(f"{s.tsa}/api/v1/timestamp", 1)],
        "tsaConfig": {"selector": "ANY"},
    }
    s.trusted_root.write_text(json.dumps(root, indent=1) + "\n")
    s.signing_config.write_text(json.dumps(config, indent=1) + "\n")
    both = {"mediaType": CLIENT_TRUST_CONFIG_TYPE, "trustedRoot": root, "signingConfig": config}
    s.client_trust_config.write_text(json.dumps(both, indent=1) + "\n")


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM, left at its default (which ends the process at once), raises SystemExit meanwhile:
    the `finally` that stops the servers and removes their folders runs, as it does on SIGINT."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    ):
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass(frozen=True)
class Cluster:
    """A Kubernetes API server as an OIDC issuer of service-account tokens: its issuer URL (its
    discovery and keys served there) and the CA its TLS certificate chains to, which Fulcio is
    given to trust (Go reads SSL_CERT_FILE)."""

    issuer: str
    ca: Path


@contextlib.contextmanager
def local_sigstore(script: ModuleType, cluster: Cluster | None = None) -> Iterator[LocalSigstore]:
    """The local Sigstore, from the binaries of scripts/consumers.py (`script`: the module
    tests.helpers.go_tools("sigstore", "tesseract") returns), until the block ends. `cluster`:
    Fulcio also takes that API server's service-account tokens."""
    sigstore, tesseract = script.named("sigstore"), script.named("tesseract")
    root = Path(tempfile.mkdtemp(prefix="imagegate-sigstore-"))
    p = _Processes(root)
    try:
        with _sigterm_unwinds(), _machine_lock(), oidc_standin() as issuers:
            # The CT log needs Fulcio's root (made in memory as Fulcio starts), Fulcio the log's
            # URL and key: the key is made first and the log started on a port chosen before.
            ct_key = _ec_key(root / "ct-log.pem")
            (root / "ct-log.pub").write_bytes(
                ct_key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
            ct_port = free_port()
            ct_url = f"http://127.0.0.1:{ct_port}"
            seconds: dict[str, float] = {}
            fulcio, fulcio_chain, seconds["fulcio"] = _start_fulcio(
                p, script.exe(sigstore), issuers, ct_url, root / "ct-log.pub", cluster
            )
            seconds["ct-log"] = _start_ct_log(
                p, script.exe(tesseract), ct_port, fulcio_chain[-1:], root / "ct-log.pem"
            )
            rekor, rekor_key, seconds["rekor"] = _start_rekor(p, script.exe(sigstore, "posix"), REKOR_ORIGIN)
            tsa, tsa_chain, seconds["tsa"] = _start_tsa(p, script.exe(sigstore, "timestamp-server"))
            trust = p.folder("trust")
            s = LocalSigstore(trust, issuers, fulcio, ct_url, rekor, tsa, seconds)
            trust_files(s, fulcio_chain, _spki(ct_key), _spki(rekor_key), tsa_chain)
            yield s
    finally:
        p.stop()
        shutil.rmtree(root, ignore_errors=True)


def bundle_stamped_before_its_certificate(s: LocalSigstore, token: str, statement: dsse.Statement) -> Bundle:
    """A bundle whose signature was timestamped by the TSA before Fulcio issued its certificate
    (notBefore a second or two later), the rest as sigstore-python's signer makes it: a
    certificate used outside its validity. Goes through sigstore-python 4.5.1's internal API
    (`_sign`, `_tsa_clients`, `_fulcio`, `_rekor`, `Bundle._from_parts`), as its own signer does."""
    context = SigningContext.from_trust_config(ClientTrustConfig.from_json(s.client_trust_config.read_text()))
    key = ec.generate_private_key(ec.SECP256R1())
    envelope = dsse._sign(key, statement)
    stamps = [tsa.request_timestamp(envelope.signature) for tsa in context._tsa_clients]
    time.sleep(2)  # X.509 times are whole seconds
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    cert = context._fulcio.signing_cert.post(csr, IdentityToken(token)).cert
    entry = context._rekor.create_entry(
        context._rekor._build_dsse_request(envelope=envelope, certificate=cert)
    )
    return Bundle._from_parts(cert, envelope, entry, stamps)
