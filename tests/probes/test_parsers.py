"""The in-image probes' pure parts, imported from probes/ as the bundle packs them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

PROBES = Path(__file__).resolve().parents[2] / "probes"


def load(name: str) -> ModuleType:
    if "_imagegate_probe" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "_imagegate_probe", PROBES / "__init__.py", submodule_search_locations=[str(PROBES)]
        )
        assert spec and spec.loader
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["_imagegate_probe"] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"_imagegate_probe.{name}")


def test_pip_check_lines_parse_exactly() -> None:
    pc = load("pip_check")
    out = (
        "nixl 1.2.0 requires nixl-cu12, which is not installed.\n"
        "moviepy 2.2.1 has requirement pillow<12.0,>=9.2.0, but you have pillow 12.2.0.\n"
        "tensorflow-io-gcs-filesystem 0.37.1 is not supported on this platform\n"
        "something pip never said\n"
    )
    problems, unparsed = pc.parse(out)
    assert [p["kind"] for p in problems] == ["missing", "conflict", "unsupported_platform"]
    assert problems[0] | {} == {
        "kind": "missing",
        "line": "nixl 1.2.0 requires nixl-cu12, which is not installed.",
        "project": "nixl",
        "version": "1.2.0",
        "requirement": "nixl-cu12",
    }
    assert problems[1]["requirement"] == "pillow<12.0,>=9.2.0"
    assert (problems[1]["dependency"], problems[1]["installed"]) == ("pillow", "12.2.0")
    assert unparsed == ["something pip never said"]


def test_pip_check_clean_output_has_no_problems() -> None:
    assert load("pip_check").parse("No broken requirements found.\n") == ([], [])


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.11.0", ">=0.11", True),
        ("0.11.0rc1", ">=0.11", False),
        ("0.10.2", ">=0.9,<0.11", True),
        ("0.10.2.dev123+g1234", ">=0.9,<0.11", True),
        ("0.8.5", "<0.9", True),
        ("0.33.0", ">=0.11", True),
        ("0.5.5", ">=0.5.5", True),
        ("0.5.4.post1", "<0.5.5", True),
        ("1.0", "==1.0.0", True),
    ],
)
def test_version_cases(version: str, spec: str, ok: bool) -> None:
    assert load("versions").matches(version, spec) is ok


def test_bounded_capture_keeps_head_and_tail() -> None:
    cap = load("capture").Bounded(cap=10)
    for _ in range(1000):
        cap.feed(b"0123456789")
    text = cap.text()
    assert cap.total == 10000 and cap.truncated
    assert text.startswith("0123456789\n[imagegate: 9980 bytes omitted]\n")
    assert text.endswith("0123456789")
    assert len(cap.head) + len(cap.tail) == 20


def test_last_exception_line() -> None:
    cli = load("cli")
    err = "Traceback (most recent call last):\n  File x\nRuntimeError: Failed to infer device type\n"
    assert cli.last_exception(err) == "RuntimeError: Failed to infer device type"


PIP_WRAPPER = """#!/usr/bin/python3
# -*- coding: utf-8 -*-
import re
import sys
from vllm.entrypoints.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def test_console_script_read_from_the_wrapper_on_path(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cli = load("cli")
    script = tmp_path / "vllm"
    script.write_text(PIP_WRAPPER)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.console_script("vllm") == "vllm.entrypoints.cli.main:main"
    # a wrapper of another shape falls back to the installed metadata (here: none)
    script.write_text('#!/bin/sh\nexec python3 -m vllm "$@"\n')
    assert cli.console_script("vllm") is None


def test_av_roundtrip_fails_on_a_frame_count_or_width_mismatch() -> None:
    """A working PyAV given valid parameters always roundtrips (tried: mpeg4, mpeg1/2video, hevc,
    vp9, av1 at odd and extreme sizes), so the FAIL path is checked on the judgement alone, fed
    the data a real roundtrip in this environment produced."""
    av_roundtrip = load("av_roundtrip")
    real = av_roundtrip.run({"frames": 3, "width": 32, "height": 16})
    assert real["status"] == "PASS", real
    data = real["data"]
    short = av_roundtrip.judge(dict(data), frames=4)  # one frame lost in the roundtrip
    assert short["status"] == "FAIL"
    assert short["detail"] == "encoded 4 frames 32x16, decoded 3 frames of widths [32]"
    narrow = av_roundtrip.judge(dict(data, decoded_widths=[16]), frames=3)  # came back at another width
    assert narrow["status"] == "FAIL" and "decoded 3 frames of widths [16]" in narrow["detail"]
