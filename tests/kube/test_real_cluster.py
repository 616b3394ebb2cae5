"""`pod run` against a real cluster, when one is configured: IMAGEGATE_TEST_KUBE_CONTEXT names a
kubectl context, IMAGEGATE_TEST_KUBE_NAMESPACE a namespace (default: default) and
IMAGEGATE_TEST_KUBE_IMAGE a Python image the cluster can pull (default: python:3.12-slim).
Skipped otherwise: no API server can start where the rest of the suite runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import imagegate

CONTEXT = os.environ.get("IMAGEGATE_TEST_KUBE_CONTEXT")

pytestmark = pytest.mark.skipif(
    not CONTEXT or shutil.which("kubectl") is None, reason="no cluster: set IMAGEGATE_TEST_KUBE_CONTEXT"
)


def test_pod_run_twice_in_a_real_cluster(tmp_path: Path) -> None:
    assert CONTEXT
    args = [
        "pod", "run", os.environ.get("IMAGEGATE_TEST_KUBE_IMAGE", "python:3.12-slim"),
        "-p", "python", "-m", "json", "--context", CONTEXT,
        "-n", os.environ.get("IMAGEGATE_TEST_KUBE_NAMESPACE", "default"),
        "--deadline", "15m", "-o", str(tmp_path), "--keep", "--name", "imagegate-real-cluster-test",
    ]  # fmt: skip
    first = imagegate(*args, timeout=1200)
    assert first.returncode == 0, first.stdout + first.stderr
    # Under the same --name, the second run finds the first one's Job (--keep) and waits it out
    # before creating its own (without --name, each run's names are its own).
    second = imagegate(*args[:-1], timeout=1200)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "deleting the previous run's job/" in second.stderr
