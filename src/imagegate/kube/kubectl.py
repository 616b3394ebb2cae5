"""The Cluster interface through `kubectl`: it already knows the user's kubeconfig, contexts,
auth plugins and proxies, which a client library would have to re-learn."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence

from imagegate._support import jsontypes
from imagegate._support.jsontypes import JsonObject
from imagegate.kube.cluster import ClusterError

CALL_TIMEOUT_S = 120.0


class KubectlCluster:
    def __init__(
        self, kubectl: str = "kubectl", context: str | None = None, kubeconfig: str | None = None
    ) -> None:
        exe = shutil.which(kubectl)
        if exe is None:
            raise ClusterError(f"{kubectl}: not found", hint="install kubectl or put it on PATH")
        self.argv = [exe]
        if context:
            self.argv += ["--context", context]
        if kubeconfig:
            self.argv += ["--kubeconfig", kubeconfig]

    def _call(self, args: list[str], *, stdin: bytes | None = None) -> bytes:
        """The one subprocess wrapper here: a timeout, and stderr in the error."""
        argv = [*self.argv, *args]
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=CALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(
                f"kubectl {' '.join(args[:3])}: no answer within {CALL_TIMEOUT_S:g}s",
                hint="check the cluster is reachable (kubectl cluster-info)",
            ) from e
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise ClusterError(f"kubectl {' '.join(args[:3])}: {err or f'exit {proc.returncode}'}")
        return proc.stdout

    def create(self, objects: Sequence[JsonObject]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self._call(["create", "-f", "-"], stdin=json.dumps(doc).encode())

    def get(self, kind: str, name: str, namespace: str) -> dict[str, object] | None:
        out = self._call(["get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found"])
        return jsontypes.obj(json.loads(out)) if out.strip() else None

    def pods(self, namespace: str, selector: str) -> list[dict[str, object]]:
        out = self._call(["get", "pods", "-n", namespace, "-l", selector, "-o", "json"])
        return jsontypes.objects(jsontypes.obj(json.loads(out)).get("items"))

    def delete(self, kind: str, name: str, namespace: str) -> None:
        self._call(
            [
                "delete",
                kind,
                name,
                "-n",
                namespace,
                "--ignore-not-found",
                "--wait=false",
                "--cascade=foreground",  # the Job's Pods go too, not orphaned
            ]
        )

    def logs(self, pod: str, namespace: str, container: str) -> bytes:
        return self._call(["logs", pod, "-n", namespace, "-c", container])
