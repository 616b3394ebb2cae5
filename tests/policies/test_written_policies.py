"""What `imagegate policies write` writes, judged by the real consumers: Kyverno's CLI (`apply
--registry`, both Kyverno policies) and policy-controller's tester, built from source at the
versions tests/consumers/*/go.mod pin (scripts/consumers.py; a cached build takes no time), on
images in a registry on 127.0.0.1 carrying VSAs the real runner signed and `imagegate attach`
attached. The policies are the command's output as a user applies it: no placeholder is filled
here. The one stand-in, named in sequences.py: a `--here` verdict re-addressed to the image."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from imagegate.attest import attach
from imagegate.policies import NAMES
from tests.attest.conftest import push_one_file_image, start_registry
from tests.helpers import go_tools, imagegate
from tests.policies.conftest import PYTHON_HERE, Keys, run_here
from tests.policies.sequences import addressed, attach_as

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def consumers() -> ModuleType:
    """scripts/consumers.py with Kyverno's CLI and policy-controller's tester built (or found)."""
    return go_tools("kyverno", "policy-controller")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_registry(tmp_path_factory.mktemp("written-registry")) as host:
        yield host


@pytest.fixture(scope="module")
def images(registry: str, policy_keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """verdict -> repo@digest of an image carrying it: PASS and FAIL signed with the trusted key
    and attached; `none` carries nothing."""
    tmp = tmp_path_factory.mktemp("written-runs")
    found = {}
    for verdict, module in (("PASS", "json"), ("FAIL", "no_such_module_anywhere"), ("none", None)):
        tag = push_one_file_image(f"{registry}/team/{verdict.lower()}:1", f"{verdict}\n".encode())
        parsed = attach.parse_image(tag)
        with attach.client_for(parsed) as client:
            ref = str(attach.resolve(client, parsed).reference)
        if module is not None:
            attempt = run_here(tmp / verdict, policy_keys.key, *PYTHON_HERE, "-m", module)
            attach_as("replace", addressed(attempt, ref, tmp / f"{verdict}-addressed", policy_keys.key), ref)
        found[verdict] = ref
    return found


@pytest.fixture(scope="module")
def written(registry: str, policy_keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("written-policies")
    done = imagegate(
        "policies", "write", "--key", str(policy_keys.pub), "--image", f"{registry}/team/*", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    return out


def _pod(ref: str, folder: Path) -> Path:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app"},
        "spec": {"containers": [{"name": "app", "image": ref}]},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pod.yaml").write_text(yaml.safe_dump(pod))
    return folder / "pod.yaml"


def _judge(consumers: ModuleType, policy: Path, ref: str, folder: Path) -> Any:
    resource = _pod(ref, folder)
    if policy.stem.startswith("policy-controller"):
        return consumers.policy_controller_test(policy, ref, resource)
    return consumers.kyverno_apply(policy, resource)


@pytest.mark.parametrize("name", NAMES)
def test_the_real_controller_admits_an_accepted_image_and_denies_the_others(
    name: str, consumers: ModuleType, written: Path, images: dict[str, str], tmp_path: Path
) -> None:
    policy = written / f"{name}.yaml"
    accepted = _judge(consumers, policy, images["PASS"], tmp_path / "pass")
    assert accepted.admitted is True, accepted.said
    for verdict in ("FAIL", "none"):
        refused = _judge(consumers, policy, images[verdict], tmp_path / verdict)
        # False, not None: a policy that judged nothing (its pattern missed) admits nothing here
        assert refused.admitted is False, (verdict, refused.said)
