"""The CLI documents itself: README.md's command reference is the --help of every command
(scripts/readme-help.py --check), every command shows examples, shell completion is offered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import imagegate, load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "readme-help.py"


def _script() -> Any:
    return load_script(SCRIPT)


def _commands() -> list[list[str]]:
    return _script().command_paths()  # type: ignore[no-any-return]


def test_the_docs_name_only_options_their_commands_have(tmp_path: Path) -> None:
    """README.md and docs/ name no option a command lacks (the --check above runs this on them);
    a renamed option in a doc's command line is caught, in a code block and in a code span."""
    doc = tmp_path / "page.md"
    doc.write_text(
        "    imagegate run IMAGE -p vllm --timeout 60   # --not-an-option in a comment is fine\n"
        "Use `imagegate cache unpack SRC --max-size 1G` or `imagegate layers SRC --max-layer 1G`.\n"
    )
    assert _script().unknown_options([doc]) == ["page.md: imagegate layers --max-layer: no such option"]


def test_readme_agrees_with_help() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr}"


def test_check_fails_when_readme_drifts(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- imagegate-help:begin -->\n<!-- imagegate-help:end -->\n")
    write = [sys.executable, str(SCRIPT), "--readme", str(readme)]
    assert subprocess.run([*write, "--write"], capture_output=True).returncode == 0
    assert subprocess.run([*write, "--check"], capture_output=True).returncode == 0
    readme.write_text(readme.read_text().replace("Render a report again", "Render a report"))
    r = subprocess.run([*write, "--check"], capture_output=True, text=True)
    assert r.returncode == 1 and "Render a report again" in r.stdout


@pytest.mark.parametrize("path", [p for p in _commands() if p], ids=lambda p: " ".join(p))
def test_every_command_help_has_examples(path: list[str]) -> None:
    r = imagegate(*path, "--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout and "imagegate " in r.stdout.split("Example", 1)[1], r.stdout


def test_shell_completion_is_offered() -> None:
    r = imagegate("--help")
    assert "--install-completion" in r.stdout
    r = imagegate("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert r.returncode == 0 and "complete" in r.stdout


def test_dash_h_is_help_everywhere() -> None:
    """-h is --help, for the app and for every command and group (inherited by subcommands)."""
    cli = imagegate
    for args in ([], ["run"], ["cache", "unpack"], ["pod", "render"], ["verify"]):
        r = cli(*args, "-h")
        assert (
            r.returncode == 0 and r.stdout.startswith("Usage: ") and "imagegate" in r.stdout.splitlines()[0]
        ), (args, r.stdout, r.stderr)
        assert r.stdout == cli(*args, "--help").stdout


def test_version_imports_none_of_the_product_s_layers() -> None:
    # `--version` opens every CI log: it answers before the app, the pipeline models (pydantic),
    # the OCI, attestation and driver layers (or typer itself) are imported.
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "imagegate", "--version"], capture_output=True, text=True
    )
    assert p.returncode == 0 and p.stdout.startswith("imagegate "), p.stdout + p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if "|" in line}
    heavy = sorted(
        m
        for m in imported
        if m.split(".")[0] in ("typer", "pydantic", "rich", "docker", "cryptography", "yaml")
        or m.startswith(("imagegate.pipeline", "imagegate.oci", "imagegate.attest", "imagegate.drivers"))
    )
    assert heavy == [], heavy


def test_run_help_loads_neither_the_pipeline_models_nor_the_attestation_layer() -> None:
    # `run --help` lists options: the pipeline models and the signing layer are imported only when
    # a run begins (pydantic itself may come with typer's own adapters).
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "imagegate", "run", "--help"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and "--all-platforms" in p.stdout, p.stdout + p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if "|" in line}
    heavy = sorted(
        m
        for m in imported
        if m.startswith(
            (
                "imagegate.pipeline",
                "imagegate.attest",
                "imagegate.usecases.accept",
                "imagegate.usecases.runner",
            )
        )
    )
    assert heavy == [], heavy


def test_pipeline_help_names_every_builtin_pipeline() -> None:
    """-p's help lists the built-in pipelines from the shipped files, so it cannot drift."""
    from imagegate import pipeline

    for command in (["run"], ["pod", "render"], ["pod", "run"]):
        text = " ".join(imagegate(*command, "--help").stdout.split())
        listed = text.split("Built-in name (")[1].split(")")[0]
        named = listed.replace("- ", "-").split(", ")  # the help wraps lines at a hyphen too
        assert named == pipeline.builtin_names(), (command, named)
        assert "gpu" in named


def test_pipelines_list_reads_at_80_columns_and_as_json() -> None:
    """Each pipeline's verdicts whole, no line past 80 columns; the JSON names every built-in."""
    import json

    from imagegate import pipeline
    from imagegate.report.console_pipelines import verdicts

    r = imagegate("pipelines", "list", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80, r.stdout
    words = r.stdout.replace(",", " ").split()
    for name in pipeline.builtin_names():
        assert f"{name} (version" in r.stdout
        assert all(v in words for v in verdicts(pipeline.load(name).pipeline))
    assert "CPU_PASS_GPU_CLI_DEFERRED" in words and "CPU_PASS_NODE_CHECK_DEFERRED" in words
    doc = json.loads(imagegate("pipelines", "list", "--format", "json").stdout)
    assert [p["name"] for p in doc["pipelines"]] == pipeline.builtin_names()
    vllm = next(p for p in doc["pipelines"] if p["name"] == "vllm")
    assert vllm["source"] == "builtin:vllm" and "CPU_PASS_GPU_CLI_DEFERRED" in vllm["verdicts"]
    gpu_cli = next(s for s in vllm["stages"] if s["id"] == "gpu_cli")
    assert gpu_cli["requires"] == ["gpu"] and gpu_cli["side"] in ("inside", "outside") and gpu_cli["probe"]
