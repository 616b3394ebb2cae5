"""What the admission tests through a real API server share (test_admission_kyverno.py,
test_admission_policy_controller.py): images pushed to the test registry and resolved, the objects
they create, and what they read back."""

from __future__ import annotations

import copy
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from imagegate.attest import attach, referrers
from tests.attest.conftest import push_one_file_image
from tests.helpers import imagegate
from tests.kube.apiserver import ApiServer
from tests.oci.infra import wait_for
from tests.policies.conftest import Keys


@dataclass
class Scene:
    """What an admission test works with: the API server, the registry, the keys and the signed
    runs, the policy file as applied, scripts/consumers.py (the CLI-level tools, the cases), a
    work folder, and the namespace its objects are created in."""

    api: ApiServer
    registry: str
    keys: Keys
    runs: dict[str, Path]
    policy: Path  # the file applied, as `imagegate policies write` wrote it
    consumers: ModuleType
    work: Path
    namespace: str  # Pod Security `privileged`: it admits every shape judged here
    n: int = 0

    def fresh(self, name: str) -> Path:
        self.n += 1
        d = self.work / f"{self.n:03d}-{name}"
        d.mkdir(parents=True)
        return d

    def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], Path, Applied]:
        """`obj` given a name of its own and the namespace, then `applied`: the object as
        applied, the folder it was written to, what the API server answered."""
        self.n += 1
        obj = named(obj, f"{obj['kind'].lower()}-{self.n}", self.namespace)
        d = self.fresh(obj["metadata"]["name"])
        return obj, d, applied(self.api, obj, d)


def written_policy(name: str, keys: Keys, registry: str, work: Path) -> Path:
    """`imagegate policies write NAME --key PUB --image REGISTRY/*` into WORK/NAME.yaml, as a user
    writes the file they apply."""
    written = imagegate("policies", "write", name, "--key", str(keys.pub), "--image", f"{registry}/*")
    assert written.returncode == 0, written.stderr
    policy = work / f"{name}.yaml"
    policy.write_text(written.stdout)
    return policy


def nvidia_runtime_class(api: ApiServer) -> None:
    """A Pod naming runtimeClassName nvidia is refused by the API server's RuntimeClass admission
    unless the class exists, as it does where NVIDIA's operator is installed."""
    runtime = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}}
    made = api.kubectl_run("apply", "-f", "-", stdin=json.dumps({**runtime, "handler": "nvidia"}))
    assert made.returncode == 0, made.stderr


def digest_of(ref: str) -> str:
    """`ref` (a tag) as repo@digest, as the registry answers now."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return str(attach.resolve(client, parsed).reference)


def pushed(registry: str, repo: str, text: bytes) -> tuple[str, str]:
    """A one-file image pushed to a fresh repository: (repo:tag, repo@digest)."""
    tag = push_one_file_image(f"{registry}/{repo}-{secrets.token_hex(3)}:1", text)
    return tag, digest_of(tag)


def carrying_verdicts(registry: str, attach_run: Callable[[str, str], None]) -> dict[str, tuple[str, str]]:
    """verdict -> (tag, repo@digest) of an image carrying it: PASS and FAIL, each attached by
    `attach_run(run, ref)` (the runs `pass` and `fail`); `none` carries nothing."""
    found = {}
    for verdict, run in (("PASS", "pass"), ("FAIL", "fail"), ("none", None)):
        tag, ref = pushed(registry, f"team/{verdict.lower()}", f"{verdict}\n".encode())
        if run is not None:
            attach_run(run, ref)
        found[verdict] = (tag, ref)
    return found


def copied_onto(statement: Path, ref: str) -> None:
    """A statement about another image appended to `ref`'s `.att` tag by hand (`imagegate
    attach` refuses it: the statement names another digest)."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        for env in referrers.standard_beside(statement, referrers.read_envelopes(statement)[0]):
            attach.append(client, attach.resolve(client, parsed), env)


def pod(image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "app", "image": image}]}}


def restarting_never(pod: dict[str, Any]) -> dict[str, Any]:
    """A Job's or CronJob's Pod must not restart Always (the API server's validation)."""
    return {**pod, "spec": {**pod["spec"], "restartPolicy": "Never"}}


def named(obj: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"] = {**obj.get("metadata", {}), "name": name, "namespace": namespace}
    return obj


@dataclass(frozen=True)
class Applied:
    admitted: bool
    said: str  # what kubectl printed: the refusal the user reads
    seconds: float
    stored: dict[str, Any] | None  # the object as the API server stored it, when admitted


def applied(api: ApiServer, obj: dict[str, Any], folder: Path) -> Applied:
    """`kubectl apply -f FOLDER/object.yaml` of `obj` (named, with its namespace), as a user
    creates it, through every admission webhook; the object read back when admitted."""
    (folder / "object.yaml").write_text(yaml.safe_dump(obj))
    start = time.monotonic()
    done = api.kubectl_run("apply", "-f", str(folder / "object.yaml"), timeout=120)
    seconds = time.monotonic() - start
    stored = None
    if done.returncode == 0:
        meta = obj["metadata"]
        got = api.kubectl_run("get", obj["kind"].lower(), meta["name"], "-n", meta["namespace"], "-o", "json")
        assert got.returncode == 0, got.stderr
        stored = json.loads(got.stdout)
    return Applied(done.returncode == 0, done.stdout + done.stderr, seconds, stored)


def images(obj: dict[str, Any]) -> list[str]:
    """Every image an object names, anywhere in it."""
    return sorted(set(_walk(obj)))


def _walk(x: Any) -> Iterator[str]:
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "image" and isinstance(v, str):
                yield v
            else:
                yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def has_default_account(api: ApiServer, ns: str) -> bool:
    """Whether the ServiceAccount controller made `ns`'s default account (a Pod waits for it)."""
    return api.kubectl_run("get", "serviceaccount", "default", "-n", ns).returncode == 0


def made_its_pod(api: ApiServer, ns: str, job: str, within_s: float = 60) -> None:
    """The Job controller made the Job's Pod (through the same admission), within `within_s`;
    else the Job's events say why not."""
    assert wait_for(lambda: _job_pods(api, ns, job) != [], timeout=within_s), api.kubectl_run(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={job}"
    ).stdout


def _job_pods(api: ApiServer, ns: str, job: str) -> list[dict[str, Any]]:
    got = api.kubectl_run("get", "pods", "-n", ns, "-l", f"job-name={job}", "-o", "json")
    return json.loads(got.stdout)["items"] if got.returncode == 0 else []  # type: ignore[no-any-return]
