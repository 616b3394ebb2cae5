"""policy-controller's webhook (cmd/webhook of github.com/sigstore/policy-controller at the version
tests/consumers/policy-controller/go.mod pins, built beside its tester by scripts/consumers.py
`build --tool policy-controller`) as the admission webhook of a real API server
(tests/kube/apiserver.py, started with `aggregator_routing=True`), installed as its release
installs it and reached as a cluster reaches it: through its Service.

policy-controller is a knative webhook: it finds the webhook configurations, the CRDs' conversion
webhook and the `webhook-certs` Secret its install made, and reconciles them itself (a
certificate for webhook.cosign-system.svc, the caBundle, the rules, the paths). So everything in
its install's kustomization (config/kustomization.yaml of its module) is applied as it is, the
Deployment excepted: the webhook runs here as a process, as that Deployment's container, in a
network namespace of its own (tests/kube/netns.py), as a Pod has one, with the Deployment's
arguments and environment, as the `webhook` ServiceAccount (a token of its own, so its RBAC is
the install's), its fixed listeners (8443, and 8008, 8080 and 9090 for profiling, probes and
metrics) on that namespace's address. The Service is the install's without its selector (no Pod
here carries the label), and an Endpoints object names the namespace's address: with
--enable-aggregator-routing the API server calls a Service's webhook at an address of its
Endpoints (kube-apiserver v1.33 reads core/v1 Endpoints there, not EndpointSlices), with TLS for
webhook.cosign-system.svc. Inside the namespace, the API server and the test registry answer on
127.0.0.1 at their own ports (relays), so the webhook reads images by the names every test uses.
Stopped, the namespace removed and the folder removed at the end, whatever happens (SIGINT too).

policy-controller's files followed (github.com/sigstore/policy-controller v0.13.1):
config/kustomization.yaml (what its install applies), config/webhook.yaml (the Deployment: its
args, env, HOME, port 8443), config/400-webhook-service.yaml (the Service: 443 to 8443),
config/500-webhook-configuration.yaml and config/501-policy-webhook-configurations.yaml (the
configurations it reconciles; namespaces opt in with policy.sigstore.dev/include=true),
config/300-clusterimagepolicy.yaml (the conversion webhook), config/200-*.yaml and 201-*.yaml (its
ServiceAccount and RBAC), cmd/webhook/main.go (the flags: --disable-tuf; the Secret and Service
names), pkg/apis/policy/v1alpha1/clusterimagepolicy_lifecycle.go (a policy's Ready condition);
and knative.dev/pkg at the version its go.mod requires (v0.0.0-20230612155445-74c4be5e935e):
injection/sharedmain/main.go and injection/health_check.go (the listeners on fixed ports),
environment/client_config.go (--kubeconfig)."""

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

import yaml

from tests.helpers import go_tools
from tests.kube.apiserver import ApiServer, stop, until_ready
from tests.kube.netns import Netns, owned

CONFIG = Path("config")
DEPLOYMENT = "webhook.yaml"
# The configurations its webhook (knative) reconciles: kind, name (cmd/webhook/main.go's flags'
# defaults; config/500-webhook-configuration.yaml, 501-policy-webhook-configurations.yaml).
WEBHOOKS = (
    ("mutatingwebhookconfiguration", "policy.sigstore.dev"),
    ("validatingwebhookconfiguration", "policy.sigstore.dev"),
    ("mutatingwebhookconfiguration", "defaulting.clusterimagepolicy.sigstore.dev"),
    ("validatingwebhookconfiguration", "validating.clusterimagepolicy.sigstore.dev"),
)
CONVERTED = "clusterimagepolicies.policy.sigstore.dev"  # the CRD whose conversion webhook it serves
INCLUDE = "policy.sigstore.dev/include"  # a namespace opts in with this label set to "true"
PORT = 8443  # the Deployment's; its namespace is its own, so it is free
READY_S = 180.0  # about 5 s here (informers, leadership, certificates); 3 minutes is broken
POLICY_READY_S = 120.0
CRDS_S = 60.0
# An image no registry holds, by digest: the mutating webhook has no tag to resolve, and the
# validating one judges it without fetching when no policy matches it.
NOWHERE = "registry.invalid/probe@sha256:" + "0" * 64


def binary() -> tuple[Path, Path]:
    """cmd/webhook, built if missing (or the test skipped: tests/helpers.go_tools), and its
    module's source (its install's config/)."""
    script = go_tools("policy-controller")
    tool = script.named("policy-controller")
    source = script.GO_CACHE / "mod" / "github.com" / "sigstore" / f"policy-controller@{tool.version}"
    return Path(script.exe(tool, "webhook")), source


def install(source: Path) -> list[dict[str, Any]]:
    """The objects its install applies (config/kustomization.yaml's resources, in its order),
    the Deployment left out and the Service without its selector."""
    kustomization = yaml.safe_load((source / CONFIG / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        for d in yaml.safe_load_all((source / CONFIG / name).read_text()):
            if not d or d["kind"] == "Deployment":
                continue
            if d["kind"] == "Service":
                d["spec"].pop("selector")  # its Endpoints are written here, not by a controller
            docs.append(d)
    return docs


def _deployment(source: Path) -> dict[str, Any]:
    (d,) = [d for d in yaml.safe_load_all((source / CONFIG / DEPLOYMENT).read_text()) if d]
    return d  # type: ignore[no-any-return]


def _env(container: dict[str, Any], namespace: str, folder: Path, kubeconfig: Path) -> dict[str, str]:
    """The container's environment as the kubelet would give it (SYSTEM_NAMESPACE from its Pod's
    namespace), HOME (an emptyDir there) the folder; KUBECONFIG for the `--kubeconfig`
    default a Pod does without."""
    fields = {"metadata.namespace": namespace}
    env = {}
    for e in container.get("env", []):
        env[e["name"]] = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    env["HOME"] = str(folder)
    return {"PATH": os.environ.get("PATH", ""), **env, "KUBECONFIG": str(kubeconfig)}


@dataclass(frozen=True)
class PolicyController:
    api: ApiServer
    folder: Path
    netns: Netns
    namespace: str  # its system namespace (cosign-system)

    def log(self, n: int = 3000) -> str:
        log = self.folder / "webhook.log"
        return log.read_text(errors="replace")[-n:] if log.exists() else "(no log)"

    def namespace_for_it(self, level: str) -> str:
        """A new namespace enforcing Pod Security `level`, opted in to its webhook."""
        ns = self.api.namespace(level)
        labelled = self.api.kubectl_run("label", "namespace", ns, f"{INCLUDE}=true")
        assert labelled.returncode == 0, labelled.stderr
        return ns

    def apply_policy(self, policy: Path, probe_ns: str, timeout: float = POLICY_READY_S) -> dict[str, Any]:
        """`kubectl apply -f POLICY` as a user applies it (through its policy webhooks and the
        CRD's conversion webhook), then wait until the policy is Ready (its reconciler compiled it
        into config-image-policies) and the webhook judges by it: a Pod of an image its glob
        matches, dry-run in `probe_ns`, is refused in the policy's name. Returns the policy as
        stored."""
        applied = self.api.kubectl_run("apply", "-f", str(policy))
        assert applied.returncode == 0, f"{applied.stdout}{applied.stderr}\n{self.log()}"
        (doc,) = [d for d in yaml.safe_load_all(policy.read_text()) if d]
        name = doc["metadata"]["name"]
        ready = self.api.kubectl_run(
            "wait", f"clusterimagepolicy/{name}", "--for=condition=Ready", f"--timeout={timeout:g}s",
            timeout=timeout + 10,
        )  # fmt: skip
        assert ready.returncode == 0, f"{ready.stderr}\n{self.log()}"
        image = doc["spec"]["images"][0]["glob"].replace("**", "probe").replace("*", "probe")
        deadline = time.monotonic() + timeout
        while f"failed policy: {name}" not in (
            said := self.dry_run(_pod(f"{image}@sha256:{'0' * 64}"), probe_ns)
        ):
            assert time.monotonic() < deadline, f"the webhook does not judge by {name}: {said}\n{self.log()}"
            time.sleep(0.5)
        got = self.api.kubectl_run("get", f"clusterimagepolicy/{name}", "-o", "json")
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)  # type: ignore[no-any-return]

    def dry_run(self, obj: dict[str, Any], namespace: str) -> str:
        """What the API server answers to `kubectl apply --dry-run=server` of `obj`: its
        admission webhooks are called, nothing is stored."""
        got = self.api.kubectl_run(
            "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(obj), timeout=60
        )
        return got.stdout + got.stderr


def _pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "probe", "image": image}]},
    }


def _apply(api: ApiServer, docs: list[dict[str, Any]], folder: Path, name: str) -> None:
    (folder / name).write_text(yaml.safe_dump_all(docs))
    # server-side: a CRD's schema is too big for the annotation a client-side apply writes
    made = api.kubectl_run("apply", "--server-side", "-f", str(folder / name), timeout=120)
    assert made.returncode == 0, made.stderr


def _established(api: ApiServer, names: set[str]) -> None:
    # polled, not `kubectl wait`: a CRD just made has no conditions yet, which wait calls an error
    deadline = time.monotonic() + CRDS_S
    while True:
        got = api.kubectl_run("get", "crd", "-o", "json")
        assert got.returncode == 0, got.stderr
        done = {
            c["metadata"]["name"]
            for c in json.loads(got.stdout)["items"]
            if any(
                x["type"] == "Established" and x["status"] == "True"
                for x in (c.get("status") or {}).get("conditions") or []  # null while just made
            )
        }
        if not (missing := names - done):
            return
        assert time.monotonic() < deadline, f"not Established within {CRDS_S:g} s: {sorted(missing)}"
        time.sleep(0.2)


def _token_kubeconfig(api: ApiServer, namespace: str, account: str, folder: Path) -> Path:
    """A kubeconfig for its ServiceAccount (a TokenRequest, as the kubelet mounts one): the
    webhook acts with the install's RBAC, not as the test's admin."""
    token = api.kubectl_run("create", "token", account, "-n", namespace, "--duration=24h")
    assert token.returncode == 0, token.stderr
    config = yaml.safe_load(api.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token.stdout.strip()}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _registered(api: ApiServer) -> bool:
    """Every configuration it reconciles has its caBundle and rules, and the CRD its conversion
    caBundle."""
    for kind, name in WEBHOOKS:
        got = api.kubectl_run("get", kind, name, "-o", "json")
        if got.returncode != 0:
            return False
        hooks = json.loads(got.stdout).get("webhooks") or []
        if not hooks or not all(h["clientConfig"].get("caBundle") and h.get("rules") for h in hooks):
            return False
    got = api.kubectl_run("get", "crd", CONVERTED, "-o", "json")
    conversion = json.loads(got.stdout)["spec"].get("conversion", {}) if got.returncode == 0 else {}
    return bool(conversion.get("webhook", {}).get("clientConfig", {}).get("caBundle"))


@contextlib.contextmanager
def started(api: ApiServer, folder: Path, registry_port: int) -> Iterator[PolicyController]:
    """policy-controller's webhook for `api` (started with aggregator_routing=True), ready: its
    configurations reconciled, and the API server calling it through its Service (a Pod of an
    image no policy matches, dry-run in an opted-in namespace, refused by it). The test registry
    on 127.0.0.1:`registry_port` is reachable from it at the same name. Stopped, its namespace
    and folder removed at the end."""
    exe, source = binary()
    folder.mkdir(parents=True, exist_ok=True)
    deployment = _deployment(source)
    namespace = deployment["metadata"]["namespace"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    docs = install(source)
    _apply(api, [d for d in docs if d["kind"] == "CustomResourceDefinition"], folder, "crds.yaml")
    _established(api, {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"})
    _apply(api, [d for d in docs if d["kind"] != "CustomResourceDefinition"], folder, "install.yaml")
    kubeconfig = _token_kubeconfig(
        api, namespace, deployment["spec"]["template"]["spec"]["serviceAccountName"], folder
    )
    procs: list[subprocess.Popen[bytes]] = []
    with owned("imagegate-pc") as netns:
        try:
            endpoints = {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": "webhook", "namespace": namespace},
                "subsets": [{"addresses": [{"ip": netns.address}], "ports": [{"port": PORT}]}],
            }
            _apply(api, [endpoints], folder, "endpoints.yaml")
            api_port = int(api.url.rpartition(":")[2])
            for port in (api_port, registry_port):
                netns.relay(port)
            # --disable-tuf: its main initialises TUF from the public sigstore root over the
            # network, which keyless authorities need; the shipped policy's are keys.
            argv = [str(exe), *container.get("args", []), "--disable-tuf", f"--secure-port={PORT}"]
            (folder / "argv.json").write_text(json.dumps(argv, indent=1))
            env = _env(container, namespace, folder, kubeconfig)
            with (folder / "webhook.log").open("wb") as log:  # the child has its own copy
                proc = subprocess.Popen(
                    netns.argv(*argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder,
                    start_new_session=True,
                )  # fmt: skip
            procs.append(proc)
            pc = PolicyController(api, folder, netns, namespace)
            probe_ns = pc.namespace_for_it("privileged")
            until_ready(
                proc, "policy-controller",
                lambda: _registered(api) and "no matching policies" in pc.dry_run(_pod(NOWHERE), probe_ns),
                READY_S, pc.log,
            )  # fmt: skip
            yield pc
        finally:
            stop(procs)
            shutil.rmtree(folder, ignore_errors=True)
