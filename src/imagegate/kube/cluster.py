"""The one small interface between imagegate and a Kubernetes API server. `kubectl` implements
it (kube/kubectl.py); a client-library implementation, or a real-cluster test, plugs in here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from imagegate._support.jsontypes import JsonObject
from imagegate.errors import EngineError


class ClusterError(EngineError):
    """The API server could not be reached or refused a request."""


class Cluster(Protocol):
    def create(self, objects: Sequence[JsonObject]) -> None:
        """Create the objects; an object that already exists is an error."""
        ...

    def get(self, kind: str, name: str, namespace: str) -> dict[str, object] | None:
        """The object (the server's answer: untrusted, narrowed where read), or None when it does
        not exist."""
        ...

    def pods(self, namespace: str, selector: str) -> list[dict[str, object]]:
        """Pods matching a label selector, Terminating ones included."""
        ...

    def delete(self, kind: str, name: str, namespace: str) -> None:
        """Ask for deletion (dependents too) and return; absent is fine. Callers wait for gone."""
        ...

    def logs(self, pod: str, namespace: str, container: str) -> bytes:
        """The container's log, stdout and stderr interleaved as the runtime kept them."""
        ...
