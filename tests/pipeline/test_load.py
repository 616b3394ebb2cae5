"""Pipeline files: strict validation with file:line:key errors, built-ins, the schema copy."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from imagegate import pipeline, resources
from imagegate.errors import UsageError
from imagegate.pipeline.schema import pipeline_schema, pipeline_schema_text
from tests.helpers import imagegate

GOOD = """\
apiVersion: imagegate/v1
name: mine
stages:
  - id: deps
    probe: pip_check
  - id: mods
    probe: find_spec
    needs: [deps]
    timeout: 90s
    with:
      modules: [json]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_good_pipeline_loads(tmp_path: Path) -> None:
    loaded = pipeline.load(str(write(tmp_path, GOOD)))
    assert [s.id for s in loaded.pipeline.stages] == ["deps", "mods"]
    assert loaded.pipeline.stages[1].timeout == 90.0
    assert len(loaded.sha256) == 64


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    text = GOOD.replace("      modules: [json]\n", "      modules: [json]\n      modlues: [x]\n")
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        pipeline.load(str(path))
    msg = str(e.value)
    assert f"{path}:12: stages[1].with.modlues: unknown key 'modlues'" in msg


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "stagez: []\n")
    with pytest.raises(UsageError, match=r"p\.yaml:12: stagez: unknown key 'stagez'"):
        pipeline.load(str(path))


def test_bad_value_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("timeout: 90s", "timeout: soon"))
    with pytest.raises(UsageError, match=r"p\.yaml:9: stages\[1\]\.timeout: .*'soon' is not a duration"):
        pipeline.load(str(path))


def test_unknown_probe(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("probe: pip_check", "probe: pip_chek"))
    with pytest.raises(UsageError, match=r"p\.yaml:4: stages\[0\]: unknown probe 'pip_chek'"):
        pipeline.load(str(path))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("id: mods", "id: deps"), "stage id 'deps' is used twice"),
        (("needs: [deps]", "needs: [later]"), "needs 'later', which is not an earlier stage"),
        (("apiVersion: imagegate/v1", "apiVersion: imagegate/v2"), "apiVersion: expected 'imagegate/v1'"),
        (("requires: []", ""), None),
    ],
)
def test_graph_and_version_errors(tmp_path: Path, change: tuple[str, str], message: str | None) -> None:
    path = write(tmp_path, GOOD.replace(*change))
    if message is None:
        pipeline.load(str(path))
        return
    with pytest.raises(UsageError, match=message):
        pipeline.load(str(path))


def test_cli_needs_exactly_one_target(tmp_path: Path) -> None:
    text = "apiVersion: imagegate/v1\nname: x\nstages:\n  - id: c\n    probe: cli\n    with:\n      args: [--help]\n"
    with pytest.raises(UsageError, match="give exactly one of command, module, entry_point"):
        pipeline.load(str(write(tmp_path, text)))


def test_missing_file_and_unknown_builtin() -> None:
    with pytest.raises(UsageError, match="not found"):
        pipeline.load("./nope.yaml")
    with pytest.raises(UsageError, match="no such built-in pipeline") as e:
        pipeline.load("vlm")
    assert "python, sglang, sglang-disagg, vllm" in (e.value.hint or "")


def test_builtins_are_valid_and_schema_accepts_them() -> None:
    assert {"python", "vllm", "sglang"} <= set(pipeline.builtin_names())
    schema = pipeline_schema()
    for name in pipeline.builtin_names():
        loaded = pipeline.load(name)
        jsonschema.validate(yaml.safe_load(loaded.text), schema)


def test_vllm_pipeline_shape() -> None:
    p = pipeline.load("vllm").pipeline
    ids = [s.id for s in p.stages]
    assert ids == ["pip_check", "find_spec", "gpu_cli", "cli_cpu", "av_roundtrip"]
    gpu = p.stages[2]
    assert gpu.requires == ["gpu"]
    cpu = p.stages[3].with_
    assert cpu.platform == "vllm-cpu"  # type: ignore[union-attr]
    assert cpu.platform_checked_against  # type: ignore[union-attr]


def test_schema_copy_in_manifests_is_current() -> None:
    stored = resources.manifests_dir() / "pipeline-v1.schema.json"
    assert stored.read_text() == pipeline_schema_text(), (
        "regenerate: imagegate pipelines schema > manifests/pipeline-v1.schema.json"
    )


def test_cli_schema_and_show() -> None:
    r = imagegate("pipelines", "schema")
    assert r.returncode == 0 and '"imagegate/v1"' in r.stdout
    r = imagegate("pipelines", "show", "vllm")
    assert r.returncode == 0 and "platform: vllm-cpu" in r.stdout
    r = imagegate("pipelines", "show", "nope")
    assert r.returncode == 3 and "no such built-in pipeline" in r.stderr
