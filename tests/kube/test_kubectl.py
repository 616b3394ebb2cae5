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
