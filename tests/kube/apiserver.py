"""A real Kubernetes API server for the tests: etcd and kube-apiserver, built from source at the
versions tests/consumers/kube/go.mod pins (scripts/consumers.py `build --tool kube`; cached by
version outside the clone), started on free loopback ports in a folder of the test's own, and
stopped and removed whatever happens. With `controllers=True`, kube-controller-manager (the Job,
namespace, service-account, garbage-collector, ttl-after-finished and node-lifecycle controllers:
the last takes a new node's not-ready taint off once it reports Ready, and taints a cordoned one)
and kube-scheduler too: a Job then makes its Pod, through the same admission. No kubelet: a Pod
is made, never run (tests/kube/kwok.py adds nodes that play one).
The flags follow the Kubernetes project's own local cluster (hack/local-up-cluster.sh)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.helpers import go_tools
from tests.oci.infra import free_port

ROOT = Path(__file__).resolve().parents[2]

READY_S = 60.0  # etcd and the API server answer within seconds here; a minute is a broken start
ISSUER = "https://kubernetes.default.svc.cluster.local"  # a cluster's usual service-account issuer


@dataclass(frozen=True)
class ApiServer:
    url: str
    kubeconfig: Path
    kubectl: str
    issuer: str = ""  # of the service-account tokens it signs
    ca: Path | None = None  # what its serving certificate chains to (its cert-dir's bundle)

    def env(self) -> dict[str, str]:
        """The environment a kubectl (imagegate's, the test's) reaches this server with: the
        kubectl built beside the server first on PATH (a fresh machine may have none)."""
        path = f"{Path(self.kubectl).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl_run(
        self, *args: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.kubectl, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
        )

    def namespace(self, level: str) -> str:
        """A new namespace that enforces the Pod Security Standard `level`."""
        name = f"{level}-{secrets.token_hex(3)}"
        made = self.kubectl_run("create", "namespace", name)
        assert made.returncode == 0, made.stderr
        label = self.kubectl_run("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
        assert label.returncode == 0, label.stderr
        return name


def binaries() -> Path:
    """The folder holding `server` (etcd), `kube-apiserver` and `kubectl`, built if missing (or
    the test skipped: tests/helpers.go_tools)."""
    script = go_tools("kube")
    return Path(script.exe(script.KUBE)).parent


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Each process asked to end (SIGTERM), killed if it has not within 10 s, last started first."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def until_ready(
    proc: subprocess.Popen[bytes],
    name: str,
    ready: Callable[[], bool],
    within_s: float,
    log: Callable[[], str],
) -> None:
    """Polls `ready` until it holds; raises, with the log, when `proc` (a controller started for
    this server) exits first or `within_s` passes."""
    deadline = time.monotonic() + within_s
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {log()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} was not ready within {within_s:g} s: {log()}")
        time.sleep(0.5)


def _ready(url: str, token: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited {p.returncode}: {_tail(logs)}")
        with contextlib.suppress(httpx.HTTPError):
            got = httpx.get(
                f"{url}/readyz", headers={"Authorization": f"Bearer {token}"}, verify=False, timeout=2
            )
            if got.status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the API server was not ready within {READY_S:g} s: {_tail(logs)}")


def _tail(logs: Path) -> str:
    return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-800:]}" for p in sorted(logs.glob("*.log")))


def _controllers(bin_dir: Path, folder: Path, logs: Path) -> list[subprocess.Popen[bytes]]:
    """kube-controller-manager and kube-scheduler, talking to the server through its kubeconfig."""
    kubeconfig = str(folder / "kubeconfig")
    manager = [
        str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
        "--controllers=job,namespace,serviceaccount,serviceaccount-token,garbagecollector,ttl-after-finished,nodelifecycle",
        f"--service-account-private-key-file={folder / 'sa.key'}", "--use-service-account-credentials=false",
        "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
    ]  # fmt: skip
    scheduler = [
        str(bin_dir / "kube-scheduler"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
        "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
    ]  # fmt: skip
    return [
        subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=(logs / f"{Path(argv[0]).name}.log").open("wb")
        )
        for argv in (manager, scheduler)
    ]


@contextlib.contextmanager
def started(
    folder: Path, *, controllers: bool = False, aggregator_routing: bool = False, own_issuer: bool = False
) -> Iterator[ApiServer]:
    """etcd and kube-apiserver in `folder`, ready (and the controllers, when asked); stopped and
    their folder removed at the end. `aggregator_routing`: a webhook named by a Service is
    called at an address of the Service's Endpoints, not at its cluster IP, which nothing here
    routes (kube-apiserver's --enable-aggregator-routing: buildServiceResolver in
    cmd/kube-apiserver/app/server.go and ResolveEndpoint in k8s.io/apiserver's
    pkg/util/proxy/proxy.go, v1.33.13, which reads core/v1 Endpoints). `own_issuer`: the
    service-account tokens it signs name its own URL as their issuer, its OIDC discovery and keys
    served there to anyone (as a cluster publishing them for an outside verifier, such as
    Fulcio, is set up: the system:service-account-issuer-discovery role bound to
    system:unauthenticated)."""
    bin_dir = binaries()
    folder.mkdir(parents=True, exist_ok=True)
    logs = folder / "logs"
    logs.mkdir()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (folder / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    token = secrets.token_hex(16)
    (folder / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    client, peer, port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    str(bin_dir / "server"),
                    "--data-dir",
                    str(folder / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{client}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{client}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{peer}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{peer}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(logs / "etcd.log").open("wb"),
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{client}",
                    f"--cert-dir={folder / 'certs'}",
                    f"--secure-port={port}",
                    "--bind-address=127.0.0.1",
                    # the first issuer signs new tokens; every one listed is accepted
                    *([f"--service-account-issuer=https://127.0.0.1:{port}"] if own_issuer else []),
                    # its keys where a verifier reaches them (else its advertised address is named)
                    *(
                        [f"--service-account-jwks-uri=https://127.0.0.1:{port}/openid/v1/jwks"]
                        if own_issuer
                        else []
                    ),
                    f"--service-account-issuer={ISSUER}",
                    f"--service-account-key-file={folder / 'sa.pub'}",
                    f"--service-account-signing-key-file={folder / 'sa.key'}",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--authorization-mode=RBAC",
                    f"--token-auth-file={folder / 'tokens.csv'}",
                    # Without the controller-manager nothing makes the default ServiceAccount that
                    # the plugin waits for; with it, every Pod goes through ServiceAccount admission.
                    *([] if controllers else ["--disable-admission-plugins=ServiceAccount"]),
                    "--allow-privileged=true",
                    *(["--enable-aggregator-routing=true"] if aggregator_routing else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=(logs / "kube-apiserver.log").open("wb"),
                start_new_session=True,
            )
        )
        url = f"https://127.0.0.1:{port}"
        _ready(url, token, procs, logs)
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters:\n- name: test\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\n"
            f"users:\n- name: admin\n  user:\n    token: {token}\n"
            "contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n"
        )
        if controllers:
            procs += _controllers(bin_dir, folder, logs)
        issuer, ca = url if own_issuer else ISSUER, folder / "certs" / "apiserver.crt"
        api = ApiServer(url, kubeconfig, str(bin_dir / "kubectl"), issuer, ca)
        if own_issuer:
            bound = api.kubectl_run(
                "create", "clusterrolebinding", "oidc-discovery-for-all",
                "--clusterrole=system:service-account-issuer-discovery", "--group=system:unauthenticated",
            )  # fmt: skip
            assert bound.returncode == 0, bound.stderr
        yield api
    finally:
        stop(procs)
        shutil.rmtree(folder, ignore_errors=True)  # etcd's data, the keys, the logs
