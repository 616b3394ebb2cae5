"""`imagegate policies`: the admission policies of this version, listed and written filled in with
a user's key, images and bound (what the real controllers make of them: tests/policies/
test_written_policies.py), and bad input refused with one line, exit 3."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
import yaml

import imagegate
from imagegate.attest import keys
from imagegate.policies import NAMES, PLACEHOLDER
from tests.helpers import imagegate as cli


@pytest.fixture(scope="module")
def pub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, public = keys.write_keypair(tmp_path_factory.mktemp("keys") / "gate", keys.generate(), None)
    return public


def test_list_names_every_policy_one_line_each_within_80_columns() -> None:
    said = cli("policies", "list")
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    for name in NAMES:
        (line,) = [x for x in lines if x.startswith(name + " ")]
        assert re.search(r"\s(Kyverno|policy-controller)", line), line
    assert all(len(x) <= 80 for x in lines), [x for x in lines if len(x) > 80]


def test_write_fills_in_the_key_the_images_and_the_bound(pub: Path, tmp_path: Path) -> None:
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    done = cli(
        "policies", "write", "--key", str(pub), "--image", "reg.local:5000/team/*", "--max-age", "2d",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.stem for p in (tmp_path / "out").iterdir()) == sorted(NAMES)
    key_lines = pub.read_text().strip().splitlines()
    for name in NAMES:
        text = (tmp_path / "out" / f"{name}.yaml").read_text()
        assert text.startswith(f"# written by imagegate {imagegate.__version__} "), text[:200]
        assert PLACEHOLDER not in text and "registry.example" not in text
        assert all(line in text for line in key_lines)
        policy = yaml.safe_load(text)
        assert policy["metadata"]["name"] == "imagegate-accepted"
        if name == "policy-controller-clusterimagepolicy":
            assert policy["spec"]["images"] == [{"glob": "reg.local:5000/team/**"}]
            (floor,) = set(re.findall(r'timeVerified: >="([^"]+)"', text))
            when = dt.datetime.strptime(floor, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            assert (
                before - dt.timedelta(days=2)
                <= when
                <= before - dt.timedelta(days=2) + dt.timedelta(minutes=5)
            )
        else:
            assert "reg.local:5000/team/*" in text and "168h" not in text
            assert re.search(r"value: 48h|duration\('48h'\)", text)


def test_write_to_stdout_is_one_stream_of_the_named_policies(pub: Path) -> None:
    done = cli("policies", "write", "kyverno-clusterpolicy", "--key", str(pub), "--image", "r.example/*")
    assert done.returncode == 0, done.stderr
    (policy,) = list(yaml.safe_load_all(done.stdout))
    assert policy["kind"] == "ClusterPolicy"
    conditions = policy["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["conditions"][0]["all"]
    assert conditions[-1]["value"] == "168h"  # the shipped bound by default
    everything = cli("policies", "write", "--key", str(pub), "--image", "r.example/*")
    kinds = [p["kind"] for p in yaml.safe_load_all(everything.stdout)]
    assert kinds == ["ClusterPolicy", "ImageValidatingPolicy", "ClusterImagePolicy"]


def _refused(*args: str) -> str:
    done = cli("policies", "write", *args)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("imagegate: error:")]
    return line


def test_write_refuses_bad_input_with_one_line(pub: Path, tmp_path: Path) -> None:
    private = pub.with_suffix(".key")
    (tmp_path / "not.pem").write_text("hello\n")
    ok = ("--key", str(pub), "--image", "r.example/*")
    assert "not a PEM public key" in _refused("--key", str(tmp_path / "not.pem"), "--image", "r.example/*")
    assert "this is a private key" in _refused("--key", str(private), "--image", "r.example/*")
    assert "image pattern is empty" in _refused("--key", str(pub), "--image", " ")
    assert "not an image pattern" in _refused("--key", str(pub), "--image", 'r.example/"a"')
    assert "no shipped policy 'kyverno'" in _refused("kyverno", *ok)
    assert "a policy needs a bound" in _refused(*ok, "--max-age", "0")
    assert "not a duration" in _refused(*ok, "--max-age", "a week")
