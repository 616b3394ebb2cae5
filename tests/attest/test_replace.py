"""The latest verdict is what a controller reads: an attach replaces, for that image, the earlier
imagegate statements of the same pipeline (acceptance, VSA, test-result), on the `.att` tag and
among the referrers, and never another tool's or another pipeline's. Against the real registry
the tests start (Debian's docker-registry: the referrers fallback tag), with manifest deletion on
and off, and behind the referrers front (tests/attest/referrers_front.py, a stand-in named as
such) for a registry that indexes referrers itself, where a replaced referrer must be deleted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import attach, bundle, dsse, keys, referrers, sign
from imagegate.attest import statement as st
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE
from tests.attest.conftest import cli, docker, pub_of, start_registry
from tests.attest.referrers_front import referrers_front
from tests.attest.test_registry import _signed

pytestmark = pytest.mark.engine

OURS = (st.PREDICATE_TYPE, VSA_PREDICATE_TYPE, TEST_RESULT_PREDICATE_TYPE)


@pytest.fixture(scope="module")
def strict_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry as distribution ships by default: manifest deletion off."""
    with start_registry(tmp_path_factory.mktemp("strict"), delete=False) as host:
        yield host


def _push(image: str, host: str, name: str) -> str:
    """The test image under a fresh repository of `host`: every test starts with no attestation."""
    ref = f"{host}/replace/{name}:1"
    docker("tag", image, ref)
    docker("push", ref)
    return ref


def _read(ref: str) -> dict[str, list[dict[str, Any]]]:
    """Every statement a controller reads for the image's digest, by where: `.att` and referrers."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        image = attach.resolve(client, parsed)
        return {
            "att": [attach.statement_of(f.envelope) for f in attach.fetch(client, image)],
            "referrers": [attach.statement_of(f.envelope) for f in referrers.fetch(client, image)],
        }


def _said(statement: dict[str, Any]) -> str:
    pred = statement["predicate"]
    return str(pred.get("verdict") or pred.get("verificationResult") or pred.get("result"))


def _pipeline(statement: dict[str, Any]) -> str:
    pred = statement["predicate"]
    return str(
        (pred.get("pipeline") or {}).get("source")
        or (pred.get("policy") or {}).get("uri")
        or pred["configuration"][0]["name"]
    )


def _foreign(ref: str, key: keys.SigningKey) -> list[dsse.Envelope]:
    """Another tool's statements about the image, both FAILED, of imagegate's standard predicate
    types and naming the same pipeline: a VSA by another verifier, a test-result of another
    configuration. Neither is imagegate's to replace."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
    subject = [{"name": ref, "digest": {"sha256": digest.partition(":")[2]}}]
    vsa = {
        "verifier": {"id": "https://other.example/verifier"},
        "policy": {"uri": "builtin:python"},
        "verificationResult": "FAILED",
    }
    tests = {"result": "FAILED", "configuration": [{"name": "builtin:python"}, {"name": "lint.yaml"}]}
    return [
        dsse.sign(
            sign.serialize(
                {"_type": st.STATEMENT_TYPE, "subject": subject, "predicateType": t, "predicate": p}
            ),
            key,
        )
        for t, p in ((VSA_PREDICATE_TYPE, vsa), (TEST_RESULT_PREDICATE_TYPE, tests))
    ]


def _fail_then_pass(tmp_path: Path, ref: str) -> tuple[Any, Any]:
    """Another tool's statements and another pipeline's FAIL first, then python's FAIL, then its
    PASS, each attempt attached with `imagegate attach` of its acceptance (which brings the VSA
    and test-result beside it). Returns the last two attaches' results."""
    key = keys.generate()
    pub = str(pub_of(key, tmp_path))
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        material = bundle.verification_material(key.public)
        referrers.attach_and_refer(
            client, parsed, [(env, material) for env in _foreign(ref, key)], [key.public]
        )
    other = _signed(tmp_path, ref, key, "FAIL", "other", pipeline="vllm")
    assert cli("attach", str(other), ref, "--key", pub).returncode == 0
    failed = cli("attach", str(_signed(tmp_path, ref, key, "FAIL", "fail")), ref, "--key", pub)
    assert failed.returncode == 0, failed.stdout + failed.stderr
    passed = cli("attach", str(_signed(tmp_path, ref, key, "PASS", "pass")), ref, "--key", pub)
    return failed, passed


def _is_foreign(statement: dict[str, Any]) -> bool:
    return "other.example" in json.dumps(statement) or "lint.yaml" in json.dumps(statement)


def _check_latest(ref: str) -> None:
    """Every imagegate statement of python's on `.att` and among the referrers is the PASS one,
    one of each type; another tool's and another pipeline's are all still there."""
    got = _read(ref)
    for place, found in got.items():
        python = [s for s in found if _pipeline(s) == "builtin:python" and not _is_foreign(s)]
        assert sorted(s["predicateType"] for s in python) == sorted(OURS), (place, found)
        assert {_said(s) for s in python} <= {"PASS", "PASSED"}, (place, [_said(s) for s in python])
        foreign = [_said(s) for s in found if _is_foreign(s)]
        assert foreign == ["FAILED", "FAILED"], (place, found)
        vllm = sorted(_said(s) for s in found if _pipeline(s) == "builtin:vllm")
        assert vllm == ["FAIL", "FAILED", "FAILED"], (place, found)


def _replaced(tmp_path: Path, ref: str) -> tuple[Any, Any]:
    """FAIL then PASS attached to `ref`: the PASS replaced the FAIL everywhere a controller reads."""
    failed, passed = _fail_then_pass(tmp_path, ref)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    _check_latest(ref)
    return failed, passed


def test_a_pass_after_a_fail_replaces_it_where_the_registry_keeps_the_fallback_tag(
    registry: str, image: str, tmp_path: Path
) -> None:
    failed, passed = _replaced(tmp_path, _push(image, registry, "fallback"))
    assert passed.stdout.count("replaced layer") == 3 and passed.stdout.count("replaced referrer") == 3
    assert "(acceptance FAIL)" in passed.stdout and "(VSA FAILED)" in passed.stdout
    assert "attempt folders" in passed.stdout
    assert "replaced" not in failed.stdout  # another pipeline's FAIL was not replaced by python's


def test_a_registry_that_indexes_referrers_has_the_replaced_ones_deleted(
    registry: str, image: str, tmp_path: Path
) -> None:
    ref = _push(image, registry, "api")
    with referrers_front(registry) as front:
        _, passed = _replaced(tmp_path, ref.replace(registry, front))
        assert "listed by the referrers API" in passed.stdout
        assert passed.stdout.count("replaced referrer") == 3


def test_a_registry_that_refuses_deletion_leaves_them_named_and_exits_1(
    strict_registry: str, image: str, tmp_path: Path
) -> None:
    # Through the fallback tag nothing needs deleting: unlisted is replaced.
    _replaced(tmp_path, _push(image, strict_registry, "strict"))
    # A registry with the referrers API lists what it holds: a refused deletion leaves it listed.
    ref = _push(image, strict_registry, "strictapi")
    with referrers_front(strict_registry) as front:
        via_front = ref.replace(strict_registry, front)
        (tmp_path / "api").mkdir()
        _, passed = _fail_then_pass(tmp_path / "api", via_front)
        assert passed.returncode == 1, passed.stdout + passed.stderr
        assert "refused to delete 3 earlier statement(s)" in passed.stderr
        assert "(acceptance FAIL)" in passed.stderr and "storage.delete.enabled" in passed.stderr
        got = _read(via_front)
        python = [s for s in got["att"] if _pipeline(s) == "builtin:python" and not _is_foreign(s)]
        assert {_said(s) for s in python} <= {"PASS", "PASSED"} and len(python) == 3  # the tag is rewritten
        left = sorted(
            _said(s) for s in got["referrers"] if _pipeline(s) == "builtin:python" and not _is_foreign(s)
        )
        assert left == ["FAIL", "FAILED", "FAILED", "PASS", "PASSED", "PASSED"]


def test_attaches_started_together_on_one_host_lose_nothing(
    registry: str, image: str, tmp_path: Path
) -> None:
    """Three attaches of three pipelines at once: each reads and writes the image's `.att` tag and
    fallback index under the image's lock, so every pipeline's statements are there at the end."""
    ref = _push(image, registry, "together")
    key = keys.generate()
    files = [_signed(tmp_path, ref, key, "PASS", n, pipeline=n) for n in ("p1", "p2", "p3")]
    pub = str(pub_of(key, tmp_path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from imagegate.cli import main; main()",
                "attach",
                str(f),
                ref,
                "--key",
                pub,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for f in files
    ]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for place, found in _read(ref).items():
        assert sorted(_pipeline(s) for s in found) == sorted(
            f"builtin:{n}" for n in ("p1", "p2", "p3") for _ in OURS
        ), place
