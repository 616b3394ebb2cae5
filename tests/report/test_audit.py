"""`imagegate audit INVENTORY.yaml`: images through their pipelines and (official, mirror) pairs
through compare, a bounded number at a time; one table, one JSON report, the worst exit code."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from imagegate.usecases import audit as batch
from tests.helpers import DOCKER_SOCK, imagegate


@pytest.mark.engine
def test_inventory_of_images_and_mirrors(images: dict[str, str], tmp_path: Path) -> None:
    subprocess.run(
        ["docker", "-H", DOCKER_SOCK, "save", images["python"], "-o", str(tmp_path / "python.tar")],
        check=True,
    )
    (tmp_path / "inventory.yaml").write_text(
        f"""apiVersion: imagegate/v1
kind: Inventory
defaults: {{pipeline: python}}
images:
  - image: {images["python"]}
  - image: {images["conflict"]}
  - {{image: {images["vllm-like"]}, pipeline: vllm, name: vllm-like}}
  - image: {images["nopython"]}
mirrors:
  - {{name: python copy, official: "docker-archive:python.tar", mirror: "docker-daemon:{images["python"]}"}}
  - {{name: not a copy, official: "docker-archive:python.tar", mirror: "docker-daemon:{images["conflict"]}"}}
"""
    )
    r = imagegate("audit", "inventory.yaml", "-o", "runs", "-j", "3", "--json", "audit.json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # a rejection outranks "could not decide" (nopython)
    table = r.stdout
    assert table.count("imagegate audit · inventory.yaml") == 1
    for outcome in ("PASS", "FAIL", "CPU_PASS_GPU_CLI_DEFERRED", "ERROR", "SAME_CONTENT", "DIFFERENT"):
        assert outcome in table
    assert "audit: 6 items: 3 accepted, 2 rejected, 1 undecided; exit 1 (rejected)" in " ".join(table.split())
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["exitCode"] == 1
    got = {i["name"]: (i["outcome"], i["exitCode"]) for i in report["items"]}
    assert got == {
        images["python"]: ("PASS", 0),
        images["conflict"]: ("FAIL", 1),
        "vllm-like": ("CPU_PASS_GPU_CLI_DEFERRED", 0),
        images["nopython"]: ("ERROR", 2),
        "python copy": ("SAME_CONTENT", 0),
        "not a copy": ("DIFFERENT", 1),
    }
    for item in report["items"]:
        if item["kind"] == "image":  # each image run keeps its evidence, renderable later
            assert (tmp_path / item["evidence"] / "statement.json").is_file()

    # JSON on stdout: nothing else there; the table moves to stderr.
    r = imagegate("audit", "inventory.yaml", "-o", "runs", "--json", "-", "-q", cwd=tmp_path)
    assert r.returncode == 1
    assert json.loads(r.stdout)["exitCode"] == 1
    assert "imagegate audit · inventory.yaml" in r.stderr


def test_inventory_errors_name_the_line(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("apiVersion: imagegate/v1\nkind: Inventory\nimages:\n  - image: a:1\n    pipline: vllm\n")
    r = imagegate("audit", str(inv))
    assert r.returncode == 3
    assert f"{inv}:5: images[0].pipline: unknown key 'pipline'" in r.stderr
    inv.write_text("apiVersion: imagegate/v1\nkind: Inventory\n")
    r = imagegate("audit", str(inv))
    assert r.returncode == 3 and "nothing to audit" in r.stderr
    # A wrong type in the pipeline file's words (what was expected, what was found), not pydantic's.
    inv.write_text("apiVersion: imagegate/v1\nkind: Inventory\nimages:\n  - image: 3\n    modules: x\n")
    r = imagegate("audit", str(inv))
    assert r.returncode == 3, r.stderr
    assert f"{inv}:4: images[0].image: expected text, found 3" in r.stderr
    assert f"{inv}:5: images[0].modules: expected a list, found 'x'" in r.stderr
    assert "Input should be" not in r.stderr
    r = imagegate("audit", "/dev/zero")
    assert r.returncode == 3 and "inventory /dev/zero: cannot read it: not a regular file" in r.stderr


def test_inventory_duplicate_keys_and_deep_nesting_are_named(tmp_path: Path) -> None:
    # The last `pipeline:` would win silently: the image would be audited with the wrong pipeline.
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "apiVersion: imagegate/v1\nkind: Inventory\nimages:\n  - image: a:1\n"
        "    pipeline: vllm\n    pipeline: python\n"
    )
    r = imagegate("audit", str(inv))
    assert r.returncode == 3, r.stderr
    assert "inv.yaml:6: images[0].pipeline: duplicate key 'pipeline' (first on line 5)" in r.stderr
    inv.write_text("apiVersion: imagegate/v1\nkind: Inventory\nimages: " + "[" * 5000 + "]" * 5000 + "\n")
    r = imagegate("audit", str(inv))
    assert r.returncode == 3 and "inv.yaml:3: nested more than 64 levels deep" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    inv.write_text("apiVersion: imagegate/v1\nkind: Inventory\nimages:\n  - image: ../containers/ID\n")
    r = imagegate("audit", str(inv))
    assert r.returncode == 3, r.stderr
    assert "inv.yaml:4: images[0].image: image '../containers/ID' is not an image reference or ID" in r.stderr


def test_worst_exit_code() -> None:
    assert batch.worst([]) == 0
    assert batch.worst([0, 0]) == 0
    assert batch.worst([0, 2]) == 2
    assert batch.worst([2, 1, 0]) == 1  # rejected outranks undecided, as FAIL outranks ERROR
    assert batch.worst([1, 3]) == 3  # an input error: the inventory itself needs fixing


@pytest.mark.engine
def test_parallelism_is_bounded(images: dict[str, str], tmp_path: Path) -> None:
    """Real images through the real engine, two at a time: no instant of the audit, by the runs'
    own recorded start and end, has more than two runs in flight, and some has two."""
    names = ("python", "conflict", "av", "nopip", "vulnerable", "clean-current")
    (tmp_path / "inv.yaml").write_text(
        "apiVersion: imagegate/v1\nkind: Inventory\ndefaults: {pipeline: python}\nimages:\n"
        + "".join(f"  - image: {images[n]}\n" for n in names)
    )
    r = imagegate("audit", "inv.yaml", "-o", "runs", "-j", "2", "--json", "audit.json", "-q", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the worst item: conflict's broken requirements, a FAIL
    report = json.loads((tmp_path / "audit.json").read_text())
    assert [i["name"] for i in report["items"]] == [images[n] for n in names]  # inventory order
    spans = []
    for item in report["items"]:
        pred = json.loads((tmp_path / item["evidence"] / "statement.json").read_text())["predicate"]
        spans.append(
            (dt.datetime.fromisoformat(pred["startedOn"]), dt.datetime.fromisoformat(pred["finishedOn"]))
        )
    # at each start, count the runs in flight (started, not yet finished)
    in_flight = [sum(1 for s, e in spans if s <= start < e) for start, _ in spans]
    assert max(in_flight) == 2, (in_flight, spans)


@pytest.mark.engine
def test_each_image_is_accepted_and_signed_as_run_does(images: dict[str, str], tmp_path: Path) -> None:
    """audit runs each image through `run`'s use case: its attempt is signed with --key and
    verifies with the public key, evidence and all; --no-sign signs none."""
    assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
    (tmp_path / "inv.yaml").write_text(
        "apiVersion: imagegate/v1\nkind: Inventory\ndefaults: {pipeline: python}\nimages:\n"
        f"  - image: {images['python']}\n  - image: {images['conflict']}\n"
    )
    args = ("audit", "inv.yaml", "-o", "runs", "--json", "audit.json", "-q")
    r = imagegate(*args, "--key", str(tmp_path / "k.key"), cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # conflict: rejected
    items = json.loads((tmp_path / "audit.json").read_text())["items"]
    for item, verdict in zip(items, ("PASS", "FAIL"), strict=True):
        envelope = tmp_path / item["data"]["attestation"]
        assert envelope.name == "attestation.dsse.json" and envelope.parent == tmp_path / item["evidence"]
        v = imagegate("verify", str(envelope), "--key", str(tmp_path / "k.pub"), "--expect-verdict", verdict)
        assert v.returncode == 0, v.stdout + v.stderr
    r = imagegate(*args, "--no-sign", cwd=tmp_path)
    items = json.loads((tmp_path / "audit.json").read_text())["items"]
    assert all(i["data"]["attestation"] is None for i in items)
    assert not any((tmp_path / i["evidence"] / "attestation.dsse.json").exists() for i in items)


def test_json_report_to_a_file_or_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from imagegate.errors import UsageError
    from imagegate.report.batch import write_json

    item = batch.ItemResult("mirror", "copy", "a -> b", "SAME_CONTENT", 0, "same content", 1.0)
    result = batch.BatchResult("inv.yaml", "t0", "t1", [item])
    assert write_json(result, None) is False and capsys.readouterr().out == ""
    assert write_json(result, tmp_path / "deep" / "audit.json") is False
    assert json.loads((tmp_path / "deep" / "audit.json").read_text())["items"][0]["name"] == "copy"
    assert write_json(result, Path("-")) is True
    assert json.loads(capsys.readouterr().out)["exitCode"] == 0
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"^writing .*file/audit.json: ") as e:
        write_json(result, tmp_path / "file" / "audit.json")
    assert e.value.hint == "check the --json path"
