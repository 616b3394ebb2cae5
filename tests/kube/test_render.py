"""pod render: the objects validate against the official Kubernetes schemas (kubernetes-validate,
strict) for the versions named here, and carry every safety field the zero-GPU mode promises."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagegate.errors import UsageError
from imagegate.kube import collect, render, validate
from imagegate.usecases import runner
from tests.helpers import imagegate

DIGEST = "sha256:" + "ab" * 32
# The oldest and newest schemas kubernetes-validate ships that we state support for, and the
# default of --kube-version.
VERSIONS = ["1.25", validate.DEFAULT_VERSION, "1.37"]


def _render(pipeline: str = "vllm", image: str = f"myorg/vllm@{DIGEST}", **kw: Any) -> render.Rendered:
    prep = runner.prepare(runner.RunOptions(pipeline=pipeline))
    return render.render(prep, image, render.PodOptions(**kw))


def _container(r: render.Rendered) -> dict[str, Any]:
    containers = r.job["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("pipeline", ["python", "vllm", "sglang"])
def test_validates_against_official_schemas(pipeline: str, version: str) -> None:
    r = _render(
        pipeline,
        node_selector={"pool": "h20"},
        tolerations=[render.parse_toleration("nvidia.com/gpu:NoSchedule")],
        priority_class="batch-low",
        service_account="acceptance",
        image_pull_secrets=["regcred"],
        run_as_user=1000,
    )
    assert validate.validate(r.objects, version) == []


def test_validator_is_not_vacuous() -> None:
    r = _render()
    broken = copy.deepcopy(r.job)
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["dropEverything"] = True
    broken["spec"]["backoffLimit"] = "zero"
    problems = validate.validate([broken], "1.30")
    assert len(problems) == 1 and problems[0].startswith(f"job/{r.name}:")
    with pytest.raises(UsageError, match=r"1\.7"):
        validate.validate(r.objects, "1.7")


def test_each_schema_is_read_once_per_process() -> None:
    """A fleet validates the same three kinds per node: the schemas are parsed once, and a broken
    object after a valid one of its kind is still refused."""
    r = _render()
    assert validate.validate(r.objects, "1.29") == []
    utils = validate._kv()
    read = utils.schema_contents.cache_info().misses
    assert validate.validate(r.objects, "1.29") == []
    assert utils.schema_contents.cache_info().misses == read
    broken = copy.deepcopy(r.job)
    broken["spec"]["backoffLimit"] = "zero"
    assert len(validate.validate([broken], "1.29")) == 1


# docs/pod.md ("What `pod render` writes") states this bound for every built-in pipeline's bundle.
BUNDLE_BUDGET_KB = 64


@pytest.mark.parametrize("pipeline", ["python", "vllm", "sglang", "sglang-disagg", "gpu"])
def test_configmap_holds_the_bundle_under_one_mib(pipeline: str) -> None:
    prep = runner.prepare(runner.RunOptions(pipeline=pipeline))
    r = render.render(prep, f"x@{DIGEST}", render.PodOptions())
    assert len(prep.bundle.data) < BUNDLE_BUDGET_KB * 1000, len(prep.bundle.data)
    size = r.configmap_bytes()
    assert size < render.CONFIGMAP_LIMIT, size
    assert len(r.yaml().encode()) < render.CONFIGMAP_LIMIT
    data = base64.b64decode(r.configmap["binaryData"][render.BUNDLE_KEY])
    assert data == prep.bundle.data
    assert r.configmap["immutable"] is True
    annotations = r.job["spec"]["template"]["metadata"]["annotations"]
    assert annotations[render.BUNDLE_ANNOTATION] == prep.bundle.sha256


def test_a_fleets_renders_share_one_encoded_bundle() -> None:
    """fleet render and fleet run hold a Job per node: each one's ConfigMap holds the same string,
    encoded once, so their memory does not grow with the nodes (benchmarks/bench_fleet.py)."""
    prep = runner.prepare(runner.RunOptions(pipeline="gpu", gpus="8"))
    made = [render.render(prep, f"x@{DIGEST}", render.PodOptions(name=f"n-{i}")) for i in range(3)]
    first, *rest = (r.configmap["binaryData"][render.BUNDLE_KEY] for r in made)
    assert all(other is first for other in rest)
    assert base64.b64decode(first) == prep.bundle.data


def test_job_runs_once_within_a_deadline() -> None:
    spec = _render(deadline_s=2400).job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 2400
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # By default the deadline covers the stages' timeouts plus an image pull.
    prep = runner.prepare(runner.RunOptions(pipeline="vllm"))
    default = render.render(prep, "x", render.PodOptions()).job["spec"]["activeDeadlineSeconds"]
    assert default >= prep.deadline() + render.PULL_ALLOWANCE_S


def test_security_fields() -> None:
    r = _render()
    pod = r.job["spec"]["template"]["spec"]
    c = _container(r)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # Read-only root: /tmp is an emptyDir, the bundle a read-only whole-volume mount (no subPath).
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"]
    bundle_mount = mounts[render.MOUNT_DIR]
    assert bundle_mount["readOnly"] is True and "subPath" not in bundle_mount
    assert volumes[bundle_mount["name"]]["configMap"]["name"] == r.configmap["metadata"]["name"]


def test_no_gpu_and_gpus_hidden() -> None:
    r = _render()
    c = _container(r)
    text = json.dumps(r.job)
    assert "nvidia.com/gpu" not in json.dumps(c["resources"]) and "gpu" not in json.dumps(c["resources"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    res = c["resources"]
    assert set(res) == {"requests", "limits"} and set(res["limits"]) == {"cpu", "memory"}
    assert "preemptionPolicy" not in text


def test_priority_class_only_when_asked_never_preemption_policy() -> None:
    plain = _render().job["spec"]["template"]["spec"]
    assert "priorityClassName" not in plain and "preemptionPolicy" not in plain
    asked = _render(priority_class="batch-low").job["spec"]["template"]["spec"]
    assert asked["priorityClassName"] == "batch-low"
    assert "preemptionPolicy" not in json.dumps(asked)


def test_image_pinned_and_run_by_its_own_python() -> None:
    c = _container(_render(image="myorg/vllm:0.11", digest=DIGEST))
    assert c["image"] == f"myorg/vllm:0.11@{DIGEST}"
    # Isolated from the image's site hooks.
    assert c["command"] == ["python3", "-I", "-S", render.BUNDLE_PATH]
    assert _container(_render(python="/opt/conda/bin/python"))["command"][0] == "/opt/conda/bin/python"
    unpinned = _render(image="myorg/vllm:0.11")
    assert _container(unpinned)["image"] == "myorg/vllm:0.11"
    assert any("not pinned" in n for n in unpinned.notes)
    with pytest.raises(UsageError, match="pinned to"):
        _render(image=f"myorg/vllm@{DIGEST}", digest="sha256:" + "cd" * 32)


def test_scheduling_inputs() -> None:
    pod = _render(
        node_selector=render.parse_node_selector(["pool=h20", "csi.example/mount=yes"]),
        tolerations=[
            render.parse_toleration("nvidia.com/gpu:NoSchedule"),
            render.parse_toleration("dedicated=acceptance:NoExecute"),
            render.parse_toleration(":PreferNoSchedule"),
        ],
        service_account="acceptance",
        image_pull_secrets=["regcred"],
    ).job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "h20", "csi.example/mount": "yes"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "acceptance", "effect": "NoExecute"},
        {"operator": "Exists", "effect": "PreferNoSchedule"},
    ]
    assert pod["serviceAccountName"] == "acceptance"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    for bad in ("nvidia.com/gpu", "k=v:Sometimes"):
        with pytest.raises(UsageError, match=f"--toleration '{bad}': expected key\\[=value\\]:effect"):
            render.parse_toleration(bad)
    with pytest.raises(UsageError, match="--node-selector 'novalue': expected key=value"):
        render.parse_node_selector(["novalue"])


def test_each_render_has_a_name_of_its_own_unless_one_is_given() -> None:
    """Two runs of one image and pipeline in one namespace never take each other's names; the
    name starts with the pipeline and the image's hash, and --name is taken as it is."""
    first, second = _render().name, _render().name
    assert first != second and first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]
    assert first.startswith(render.stable_name("vllm", f"myorg/vllm@{DIGEST}") + "-")
    assert _render().name.rsplit("-", 1)[0] != _render(image="other/image:1").name.rsplit("-", 1)[0]
    assert len(first) <= 52 and _render(name="mine").name == "mine"
    with pytest.raises(UsageError, match="--name 'Not_A_DNS_Label': lower-case letters, digits and '-'"):
        _render(name="Not_A_DNS_Label")


def test_cli_render_prints_valid_yaml(tmp_path: Path) -> None:
    res = imagegate(
        "pod", "render", "myorg/vllm:0.11", "-p", "vllm", "--digest", DIGEST, "-n", "accept",
        "--node-selector", "pool=h20", "--toleration", "nvidia.com/gpu:NoSchedule",
        "--priority-class", "batch-low", "--deadline", "40m", "--kube-version", "1.30",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    objs = list(yaml.safe_load_all(res.stdout))
    assert [o["kind"] for o in objs] == ["Secret", "ConfigMap", "Job"]
    assert objs[2]["spec"]["activeDeadlineSeconds"] == 2400
    assert all(o["metadata"]["namespace"] == "accept" for o in objs)
    assert validate.validate(objs, "1.30") == []
    assert "validated against Kubernetes 1.30" in res.stderr
    bad = imagegate("pod", "render", "x:1", "--toleration", "gpu")
    assert bad.returncode == 3 and "key[=value]:effect" in bad.stderr


def test_the_event_key_is_a_secret_and_the_job_is_stable() -> None:
    """Two renders of the same inputs and --name: the Job and the ConfigMap are the same bytes (they can be
    committed and reviewed) and hold no key; each render's key is a fresh 32 bytes in its own
    Secret, which the Job's env refers to and which validates."""
    args = ("pod", "render", f"myorg/vllm@{DIGEST}", "-p", "python", "-n", "accept", "--name", "one-run")
    first, second = imagegate(*args), imagegate(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    docs = [first.stdout.split("\n---\n"), second.stdout.split("\n---\n")]
    assert [len(d) for d in docs] == [3, 3]
    assert docs[0][1:] == docs[1][1:]  # the ConfigMap and the Job, byte for byte
    secrets = [yaml.safe_load(d[0]) for d in docs]
    keys = [bytes.fromhex(base64.b64decode(s["data"][render.SECRET_KEY]).decode()) for s in secrets]
    assert len(keys[0]) == 32 and keys[0] != keys[1]
    job = yaml.safe_load(docs[0][2])
    for key in keys:
        assert key.hex() not in docs[0][2] and base64.b64encode(key.hex().encode()).decode() not in docs[0][2]
    (env,) = [
        e
        for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == render.EVENT_KEY_ENV
    ]
    assert env == {
        "name": render.EVENT_KEY_ENV,
        "valueFrom": {"secretKeyRef": {"name": secrets[0]["metadata"]["name"], "key": render.SECRET_KEY}},
    }
    assert secrets[0]["metadata"]["name"] == job["metadata"]["name"] and secrets[0]["immutable"] is True
    assert validate.validate([secrets[0]], "1.30") == []
    broken = dict(secrets[0], data={render.SECRET_KEY: 42})
    assert validate.validate([broken], "1.30") != []  # the Secret's schema is really checked


def test_secret_out_keeps_the_key_off_stdout(tmp_path: Path) -> None:
    """--secret-out: stdout is the ConfigMap and the Job alone, byte for byte the same for the
    same inputs (a GitOps repository can hold it); the key goes to a new file only its owner
    reads; an existing file is never overwritten (it may hold an earlier run's key)."""
    args = ("pod", "render", f"myorg/vllm@{DIGEST}", "-p", "python", "-n", "accept")
    first = imagegate(*args, "--secret-out", str(tmp_path / "a.yaml"))
    second = imagegate(*args, "--secret-out", str(tmp_path / "b.yaml"))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    assert [o["kind"] for o in yaml.safe_load_all(first.stdout)] == ["ConfigMap", "Job"]
    secrets = [yaml.safe_load((tmp_path / n).read_text()) for n in ("a.yaml", "b.yaml")]
    assert [s["kind"] for s in secrets] == ["Secret", "Secret"]
    assert secrets[0]["data"] != secrets[1]["data"]  # a fresh key each render
    for s in secrets:
        assert s["data"][render.SECRET_KEY] not in first.stdout
    assert (tmp_path / "a.yaml").stat().st_mode & 0o777 == 0o600
    # The collector reads the file back: the key the Job's Pod will be given.
    job = list(yaml.safe_load_all(first.stdout))[1]
    pod = {"spec": job["spec"]["template"]["spec"]}
    read = collect.read_secret_file(tmp_path / "a.yaml")
    assert collect.event_key(pod, read) == bytes.fromhex(
        base64.b64decode(secrets[0]["data"][render.SECRET_KEY]).decode()
    )
    before = (tmp_path / "a.yaml").read_bytes()
    again = imagegate(*args, "--secret-out", str(tmp_path / "a.yaml"))
    assert again.returncode == 3 and "already exists" in again.stderr and again.stdout == ""
    assert (tmp_path / "a.yaml").read_bytes() == before
