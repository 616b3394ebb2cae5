"""Kyverno's admission controller (cmd/kyverno of github.com/kyverno/kyverno at the version
tests/consumers/kyverno/go.mod pins, built beside its CLI by scripts/consumers.py `build --tool
kyverno`) as a webhook of a real API server (tests/kube/apiserver.py), run out of cluster as
Kyverno provides for: `--serverIP` makes it register URL webhooks (https://127.0.0.1:PORT/...)
that the API server calls on loopback, with a certificate it issues itself for that address.

What a cluster install gives it comes from Kyverno's install manifest in its module
(config/install-latest-testing.yaml: its Helm chart rendered with the defaults, Makefile target
codegen-manifest-install-latest): the `kyverno` Namespace, the config and metrics ConfigMaps,
and the admission controller Deployment's arguments and environment; the CRDs from config/crds.
Only what running outside a Pod needs is changed (`_out_of_cluster`). Stopped whatever happens
(SIGINT too), its folder removed at the end.

Kyverno's files followed (github.com/kyverno/kyverno v1.19.1): cmd/kyverno/main.go (flags,
caSecretName/tlsSecretName required, the webhook server, leader election),
cmd/internal/check.go (the environment it insists on), cmd/internal/flag.go (--kubeconfig,
--allowInsecureRegistry), cmd/internal/configmap.go (the ConfigMaps it warms up from),
pkg/config/config.go (the environment's names and the webhook configurations' names),
pkg/controllers/webhook/controller.go (the webhooks its leader registers),
pkg/controllers/webhook/utils.go (newClientConfig: a URL webhook when serverIP is set),
pkg/tls/keypair.go (generateTLS: serverIP's host as an IP SAN), pkg/utils/runtime/utils.go
(with serverIP set no Deployment is looked for), pkg/webhooks/server.go (/health/readiness),
Makefile (LD_FLAGS, in scripts/consumers.py; the install manifest's target)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.helpers import go_tools
from tests.kube.apiserver import ApiServer, stop, until_ready
from tests.oci.infra import free_port

INSTALL = Path("config") / "install-latest-testing.yaml"
CRDS = Path("config") / "crds"
DEPLOYMENT = "kyverno-admission-controller"
POD_NAME = f"{DEPLOYMENT}-out-of-cluster"  # the name its leader-election lease holds
# Two webhooks its leader registers (pkg/controllers/webhook/controller.go): a ClusterPolicy is
# admitted through the first; the API server calls the second on the kyverno-health Lease that its
# watchdog updates, Kyverno's own check that the API server reaches it.
WEBHOOKS = (
    ("validatingwebhookconfiguration", "kyverno-policy-validating-webhook-cfg"),
    ("mutatingwebhookconfiguration", "kyverno-verify-mutating-webhook-cfg"),
)
READY_S = 180.0  # about 17 s here (informers, certificates, leadership); 3 minutes is broken
POLICY_READY_S = 120.0
CRDS_S = 60.0  # the API server establishes a CRD within a second here


def binary() -> tuple[Path, Path]:
    """cmd/kyverno, built if missing (or the test skipped: tests/helpers.go_tools), and its
    module's source (CRDs, the release manifest)."""
    script = go_tools("kyverno")
    tool = script.named("kyverno")
    source = script.GO_CACHE / "mod" / "github.com" / "kyverno" / f"kyverno@{tool.version}"
    return Path(script.exe(tool, "kyverno")), source


def _release(source: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((source / INSTALL).read_text()) if d]


def _argv(exe: Path, chart_args: list[str], overrides: dict[str, str]) -> list[str]:
    """The Deployment's arguments, each flag named in `overrides` given its value instead."""
    kept = [a for a in chart_args if a.removeprefix("--").partition("=")[0] not in overrides]
    return [str(exe), *kept, *(f"--{k}={v}" for k, v in overrides.items())]


def _env(container: dict[str, Any], namespace: str, folder: Path) -> dict[str, str]:
    """The container's environment as the kubelet would give it: the Pod's namespace and name
    for the two fieldRefs; the sigstore root (TUF_ROOT, a path in the image) in the folder."""
    fields = {"metadata.namespace": namespace, "metadata.name": POD_NAME}
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    env["TUF_ROOT"] = str(folder / "sigstore")
    # HOME: nothing of this machine's (a docker config, a kube config) reaches it
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(folder), **env}


@dataclass(frozen=True)
class Kyverno:
    api: ApiServer
    folder: Path
    url: str  # its webhook server, as the API server calls it

    def log(self, n: int = 3000) -> str:
        log = self.folder / "kyverno.log"
        return log.read_text(errors="replace")[-n:] if log.exists() else "(no log)"

    def apply_policy(self, policy: Path, timeout: float = POLICY_READY_S) -> dict[str, Any]:
        """`kubectl apply -f POLICY` as a user applies it (through Kyverno's policy webhook),
        then wait until Kyverno reports the policy Ready (its webhooks configured for the
        policy's kinds). Returns the policy as stored."""
        applied = self.api.kubectl_run("apply", "-f", str(policy))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        (name,) = [d["metadata"]["name"] for d in yaml.safe_load_all(policy.read_text()) if d]
        ready = self.api.kubectl_run(
            "wait", f"clusterpolicy/{name}", "--for=condition=Ready", f"--timeout={timeout:g}s",
            timeout=timeout + 10,
        )  # fmt: skip
        assert ready.returncode == 0, f"{ready.stderr}\n{self.log()}"
        got = self.api.kubectl_run("get", f"clusterpolicy/{name}", "-o", "json")
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)  # type: ignore[no-any-return]


def _out_of_cluster(api: ApiServer, port: int) -> dict[str, str]:
    """What differs from the chart's arguments outside a Pod: the URL webhooks on loopback, the
    API server from a kubeconfig, the plain-HTTP test registry, every listener on loopback on a
    free port (two of the chart's are fixed ports on every address), no credential helper (the
    test registry needs none, and they would read this machine's), a log without colour codes."""
    return {
        "serverIP": f"127.0.0.1:{port}",
        "webhookServerHost": "127.0.0.1",
        "webhookServerPort": str(port),
        "kubeconfig": str(api.kubeconfig),
        "allowInsecureRegistry": "true",
        "metricsHost": "127.0.0.1",
        "metricsPort": str(free_port()),
        "controllerRuntimeMetricsAddress": f"127.0.0.1:{free_port()}",
        "registryCredentialHelpers": "",
        "disableLogColor": "true",  # its log is a file
    }


def _install(api: ApiServer, source: Path, docs: list[dict[str, Any]], folder: Path) -> None:
    """The CRDs (server-side: several are too big for the annotation a client-side apply
    writes), the Namespace and the two ConfigMaps of the release manifest."""
    crds = api.kubectl_run("apply", "--server-side", "-R", "-f", str(source / CRDS), timeout=120)
    assert crds.returncode == 0, crds.stderr
    names = {
        d["metadata"]["name"]
        for f in sorted((source / CRDS).rglob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    }
    # polled, not `kubectl wait`: a CRD just made has no conditions yet, which wait calls an error
    deadline = time.monotonic() + CRDS_S
    while (missing := names - _established(api)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not missing, f"not Established within {CRDS_S:g} s: {sorted(missing)}"
    objects = [d for d in docs if d["kind"] == "Namespace"] + [d for d in docs if d["kind"] == "ConfigMap"]
    (folder / "objects.yaml").write_text(yaml.safe_dump_all(objects))
    made = api.kubectl_run("apply", "-f", str(folder / "objects.yaml"))
    assert made.returncode == 0, made.stderr


def _established(api: ApiServer) -> set[str]:
    got = api.kubectl_run("get", "crd", "-o", "json")
    assert got.returncode == 0, got.stderr
    return {
        c["metadata"]["name"]
        for c in json.loads(got.stdout)["items"]
        if any(
            x["type"] == "Established" and x["status"] == "True"
            for x in (c.get("status") or {}).get("conditions") or []
        )
    }


def _registered(api: ApiServer, url: str) -> bool:
    for kind, name in WEBHOOKS:
        got = api.kubectl_run("get", kind, name, "-o", "json")
        if got.returncode != 0:
            return False
        hooks = json.loads(got.stdout).get("webhooks") or []
        if not hooks or not all(h["clientConfig"].get("url", "").startswith(url) for h in hooks):
            return False
    return True


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health/readiness", verify=False, timeout=2).status_code == 200
    return False


@contextlib.contextmanager
def started(api: ApiServer, folder: Path, flags: dict[str, str] | None = None) -> Iterator[Kyverno]:
    """Kyverno's admission controller for `api`, ready: its webhook server answering and its
    webhooks registered with the API server. `flags`: more of its flags, as an install sets them
    (--enableTuf, --tufMirror, --tufRoot for a Sigstore of one's own). Stopped, and its folder
    removed, at the end."""
    exe, source = binary()
    folder.mkdir(parents=True, exist_ok=True)
    docs = _release(source)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == DEPLOYMENT]
    namespace = deployment["metadata"]["namespace"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "kyverno"]
    _install(api, source, docs, folder)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    argv = _argv(exe, container["args"], {**_out_of_cluster(api, port), **(flags or {})})
    (folder / "argv.json").write_text(json.dumps(argv, indent=1))
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=(folder / "kyverno.log").open("wb"),
        env=_env(container, namespace, folder), cwd=folder, start_new_session=True,
    )  # fmt: skip
    kyverno = Kyverno(api, folder, url)
    try:
        until_ready(proc, "kyverno", lambda: _healthy(url) and _registered(api, url), READY_S, kyverno.log)
        yield kyverno
    finally:
        stop([proc])
        shutil.rmtree(folder, ignore_errors=True)
