"""KubectlCluster's calls and errors. A stand-in `kubectl` on PATH answers as the API server
would (none can start here): it records its argv and prints canned JSON."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from imagegate.kube.cluster import ClusterError
from imagegate.kube.kubectl import KubectlCluster

STUB = """#!{python}
import json, os, sys
with open(os.environ["KUBECTL_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": sys.stdin.read() if "-f" in sys.argv else ""}}) + "\\n")
if "missing" in sys.argv:
    sys.exit(0)  # --ignore-not-found: nothing printed
if "forbidden" in sys.argv:
    sys.stderr.write('Error from server (Forbidden): jobs.batch is forbidden: User "ci" cannot create\\n')
    sys.exit(1)
if sys.argv[1:2] == ["logs"] or "logs" in sys.argv:
    sys.stdout.write('{{"event": "start", "imagegate": 1}}\\n')
elif "get" in sys.argv and "pods" in sys.argv:
    print(json.dumps({{"kind": "PodList", "items": [{{"kind": "Pod", "metadata": {{"name": "p-1"}}}}]}}))
elif "get" in sys.argv:
    print(json.dumps({{"kind": "Job", "metadata": {{"name": sys.argv[sys.argv.index("get") + 2]}}}}))
"""


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = tmp_path / "bin" / "kubectl"
    exe.parent.mkdir()
    exe.write_text(STUB.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUBECTL_LOG", str(log))
    return log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_calls(kubectl: Path) -> None:
    c = KubectlCluster(context="acceptance")
    assert c.get("job", "j", "ns") == {"kind": "Job", "metadata": {"name": "j"}}
    assert c.get("job", "missing", "ns") is None
    assert [p["metadata"]["name"] for p in c.pods("ns", "imagegate/run=j")] == ["p-1"]
    assert c.logs("p-1", "ns", "probe").startswith(b'{"event"')
    c.delete("job", "j", "ns")
    c.create([{"kind": "ConfigMap", "metadata": {"name": "j"}}])
    argvs = [x["argv"] for x in calls(kubectl)]
    assert all(a[:2] == ["--context", "acceptance"] for a in argvs)
    assert argvs[4][2:] == [
        "delete",
        "job",
        "j",
        "-n",
        "ns",
        "--ignore-not-found",
        "--wait=false",
        "--cascade=foreground",
    ]
    assert json.loads(str(calls(kubectl)[5]["stdin"]))["items"][0]["kind"] == "ConfigMap"


def test_refusal_carries_the_servers_words(kubectl: Path) -> None:
    with pytest.raises(ClusterError, match="Forbidden"):
        KubectlCluster().get("job", "forbidden", "ns")


def test_no_kubectl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClusterError, match="not found"):
        KubectlCluster()


@pytest.mark.parametrize(("command", "code"), [("run", 2), ("collect", 1)])
def test_fleet_talks_to_the_named_context_only(
    kubectl: Path, tmp_path: Path, command: str, code: int
) -> None:
    """`fleet run/collect --context`: every kubectl call names it (a fleet's nodes are in one
    cluster, and the current context may be another's). The stand-in's Job never ends: run has
    no result for the node at its deadline (exit 2); collect reads the Pod's log as it is, a
    check that never ran, so the node is unfit (exit 1)."""
    import subprocess

    from tests.fleet.test_judge import _k8s_node

    (tmp_path / "nodes.json").write_text(json.dumps({"items": [_k8s_node("h200-a")]}))
    image = "registry.example/team/torch@sha256:" + "ab" * 32
    done = subprocess.run(
        [sys.executable, "-m", "imagegate", "fleet", command, image, "--nodes", "nodes.json",
         "--context", "acceptance", "-n", "checks", "-o", "out", *(["--timeout", "5"] if command == "run" else [])],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "h200-a" in done.stdout
    argvs = [x["argv"] for x in calls(kubectl)]
    assert argvs and all(a[:2] == ["--context", "acceptance"] for a in argvs)
    assert any("imagegate-node-check-h200-a" in " ".join(a) for a in argvs)
