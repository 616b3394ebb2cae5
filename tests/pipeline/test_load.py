"""Pipeline files: strict validation with file:line:key errors, built-ins, the schema copy."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from imagegate import pipeline
from imagegate._support import resources
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
    with pytest.raises(UsageError, match=r"stages\[1\]\.with\.modlues: unknown key 'modlues'") as e:
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
        (
            ("apiVersion: imagegate/v1", "apiVersion: imagegate/v2"),
            "apiVersion: found 'imagegate/v2', expected 'imagegate/v1'",
        ),
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
    assert "python, sglang, sglang-disagg, sglang-serve, vllm, vllm-serve" in (e.value.hint or "")


def test_builtins_are_valid_and_schema_accepts_them() -> None:
    assert {"python", "vllm", "sglang"} <= set(pipeline.builtin_names())
    schema = pipeline_schema()
    for name in pipeline.builtin_names():
        loaded = pipeline.load(name)
        jsonschema.validate(yaml.safe_load(loaded.text), schema)


def test_vllm_pipeline_shape() -> None:
    p = pipeline.load("vllm").pipeline
    ids = [s.id for s in p.stages]
    assert ids == ["pip_check", "find_spec", "gpu_cli", "cli_cpu", "av_roundtrip", "layers"]
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


# Hostile or mistaken files: every one is a UsageError (exit 3) naming the file and the line.

ONE = "apiVersion: imagegate/v1\nname: x\nstages:\n  - id: a\n    probe: pip_check\n"


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    # The last one would win: a GPU stage silently becomes a CPU one.
    path = write(tmp_path, ONE + "    requires: [gpu]\n    requires: []\n")
    with pytest.raises(
        UsageError, match=r"p\.yaml:7: stages\[0\]\.requires: duplicate key 'requires' \(first on line 6\)"
    ):
        pipeline.load(str(path))


def test_duplicate_key_in_a_flow_mapping(tmp_path: Path) -> None:
    path = write(
        tmp_path, "apiVersion: imagegate/v1\nname: x\nstages:\n  - {id: a, probe: pip_check, id: b}\n"
    )
    with pytest.raises(
        UsageError, match=r"p\.yaml:4: stages\[0\]\.id: duplicate key 'id' \(first on line 4\)"
    ):
        pipeline.load(str(path))


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = (
        "apiVersion: imagegate/v1\nname: x\nbase: &base {probe: pip_check, timeout: 60}\n"
        "stages:\n  - <<: *base\n    id: a\n    timeout: 30\n"
    )
    # `base` is not a pipeline key: the merge itself is accepted, the unknown key is what fails.
    with pytest.raises(UsageError, match=r"p\.yaml:3: base: unknown key 'base'"):
        pipeline.load(str(write(tmp_path, text)))


def test_deeply_nested_yaml_is_an_input_error(tmp_path: Path) -> None:
    path = write(tmp_path, ONE + "    with: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(UsageError, match=r"p\.yaml:6: nested more than 64 levels deep"):
        pipeline.load(str(path))


def test_alias_bomb_is_an_input_error(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = write(tmp_path, ONE + "\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=r"p\.yaml:\d+: expands to more than 100000 values"):
        pipeline.load(str(path))


def test_self_referencing_alias(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"p\.yaml:6: an alias refers to itself"):
        pipeline.load(str(write(tmp_path, ONE + "    with: &w {ignore: *w}\n")))


def test_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = write(tmp_path, ONE + "# " + "x" * (2 << 20) + "\n")
    with pytest.raises(UsageError, match=r"pipeline file .*p\.yaml: larger than 1 MiB"):
        pipeline.load(str(path))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (".inf", "inf is not a duration: give a finite number of seconds"),
        (".nan", "nan is not a duration: give a finite number of seconds"),
        ("-.inf", "-inf is not a duration"),
        ("1.0e+12", r"1e\+12s is more than a day \(86400s\)"),
        ("1e12", "'1e12' is not a duration"),
        ("100000h", r"3.6e\+08s is more than a day"),
        ("0", "0 is not a duration: it must be positive"),
        ("-5", "-5 is not a duration: it must be positive"),
        ("''", "'' is not a duration"),
        ("", "empty; give seconds"),
    ],
)
def test_timeouts_must_be_finite_positive_and_sane(tmp_path: Path, value: str, message: str) -> None:
    path = write(tmp_path, ONE + f"    timeout: {value}\n")
    with pytest.raises(UsageError, match=rf"p\.yaml:6: stages\[0\]\.timeout: {message}"):
        pipeline.load(str(path))


def test_schema_bounds_the_timeout() -> None:
    schema = pipeline_schema()
    jsonschema.validate(yaml.safe_load(ONE + "    timeout: 86400\n"), schema)
    # The stages are a oneOf; the error names the failing stage, not the bound.
    with pytest.raises(
        jsonschema.ValidationError, match=r"'timeout': 1000000000000\.0\} is not valid under any"
    ):
        jsonschema.validate(yaml.safe_load(ONE + "    timeout: 1.0e+12\n"), schema)


def test_invalid_regex_is_located(tmp_path: Path) -> None:
    text = ONE.replace(
        "probe: pip_check", "probe: cli\n    with:\n      command: [x]\n      stdout_regex: '([a-'"
    )
    with pytest.raises(
        UsageError,
        match=r"p\.yaml:8: stages\[0\]\.with\.stdout_regex: '\(\[a-' is not a valid regular expression",
    ):
        pipeline.load(str(write(tmp_path, text)))


def test_graph_errors_name_their_line_and_key(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"p\.yaml:8: stages\[1\]\.needs\[0\]: stage 'mods' needs 'later'"):
        pipeline.load(str(write(tmp_path, GOOD.replace("needs: [deps]", "needs: [later]"))))
    with pytest.raises(UsageError, match=r"p\.yaml:6: stages\[1\]\.id: stage id 'deps' is used twice"):
        pipeline.load(str(write(tmp_path, GOOD.replace("id: mods", "id: deps"))))


def test_messages_speak_the_products_words(tmp_path: Path) -> None:
    text = (
        ONE.replace("id: a", "id: A")
        + "    requires: [cpu]\n    timeout:\n  - id: b\n    probe: cli\n    with: {command: x, expect_exit: many}\n  - id: c\n"
    )
    with pytest.raises(UsageError) as e:
        pipeline.load(str(write(tmp_path, text)))
    msg = str(e.value)
    assert "p.yaml:4: stages[0].id: 'A' is not valid here: use lowercase letters" in msg
    assert "p.yaml:6: stages[0].requires[0]: expected 'gpu', found 'cpu'" in msg
    assert "p.yaml:7: stages[0].timeout: empty; give seconds" in msg
    assert "p.yaml:10: stages[1].with.command: expected a list, found 'x'" in msg
    assert "p.yaml:10: stages[1].with.expect_exit: expected a whole number, found 'many'" in msg
    assert "p.yaml:11: stages[2]: missing key 'probe'" in msg
    for pydantic_words in ("Value error", "Input should be", "got None", "Field required", "[type="):
        assert pydantic_words not in msg


def test_cli_reports_bad_files_with_exit_3(tmp_path: Path) -> None:
    for text in (
        ONE + "    requires: [gpu]\n    requires: []\n",
        ONE + "    with: " + "[" * 50_000 + "]" * 50_000 + "\n",
        ONE.replace("probe: pip_check", "probe: cli\n    with: {command: [x], stdout_regex: '([a-'}"),
    ):
        r = imagegate("pipelines", "validate", str(write(tmp_path, text)))
        assert r.returncode == 3, r.stderr
        assert "p.yaml:" in r.stderr and "Traceback" not in r.stderr
