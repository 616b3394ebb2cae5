"""The container's limits hit for real (memory, pids), and the pipeline and cli options a user
relies on: stop_on_fail, expect_exit, stdout/stderr patterns, record_raw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import container_exists, containers_of, imagegate


def _run(image: str, tmp_path: Path, body: str, *extra: str, head: str = "") -> tuple[Any, Path]:
    tmp_path.mkdir(exist_ok=True)
    pipe = tmp_path / "p.yaml"
    pipe.write_text(f"apiVersion: imagegate/v1\nname: t\n{head}stages:\n{body}")
    r = imagegate("run", image, "-p", str(pipe), "-o", str(tmp_path / "o"), "--no-sign", *extra)
    (attempt,) = [p.parent for p in (tmp_path / "o").glob("*/*/statement.json")]
    return r, attempt


def _stages(attempt: Path) -> dict[str, dict[str, Any]]:
    statement = json.loads((attempt / "statement.json").read_text())
    return {s["id"]: s for s in statement["predicate"]["stages"]}


def test_memory_limit_kills_the_hog_and_the_run_goes_on(images: dict[str, str], tmp_path: Path) -> None:
    body = (
        "  - id: hog\n    probe: cli\n"
        "    with: {command: [python3, -c, \"b = bytearray(512 << 20); print('allocated')\"]}\n"
        "  - id: after\n    probe: cli\n"
        "    with: {command: [python3, -c, \"print('still here')\"], stdout_regex: still here}\n"
    )
    # One controller (-j 1): the hog and the next stage share the container and its limit.
    r, attempt = _run(images["python"], tmp_path, body, "--memory", "128m", "-j", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    st = _stages(attempt)
    # the kernel's OOM killer ended the 512 MiB allocation inside the 128 MiB container
    assert st["hog"]["status"] == "FAIL" and "exit -9" in st["hog"]["detail"], st["hog"]
    assert "allocated" not in (attempt / "stages/01-hog/stdout.txt").read_text()
    assert st["after"]["status"] == "PASS"  # the controller itself survived
    (controller,) = json.loads((attempt / "run.json").read_text())["run"]["controllers"]
    assert controller["memory"] == "128m"
    assert not any(container_exists(c) for c in containers_of(attempt))


def test_pids_limit_stops_a_thread_flood(images: dict[str, str], tmp_path: Path) -> None:
    flood = (
        "import threading\\nev = threading.Event()\\nn = 0\\ntry:\\n    while n < 100000:\\n"
        "        threading.Thread(target=ev.wait, daemon=True).start()\\n        n += 1\\n"
        "except RuntimeError:\\n    print('limited at', n)\\nelse:\\n    print('unlimited')\\nev.set()"
    )
    body = (
        f'  - id: flood\n    probe: cli\n    timeout: 120s\n    with: {{command: [python3, -c, "{flood}"]}}\n'
    )
    r, attempt = _run(images["python"], tmp_path, body)
    assert r.returncode == 0, r.stdout + r.stderr
    out = (attempt / "stages/01-flood/stdout.txt").read_text().split()
    limit = json.loads((attempt / "run.json").read_text())["run"]["controllers"][0]["pids_limit"]
    assert out[:2] == ["limited", "at"], out
    # every process and thread of the container counts: the flood stops just short of the limit
    assert limit - 64 <= int(out[2]) < limit, (out, limit)
    assert not any(container_exists(c) for c in containers_of(attempt))


def test_stop_on_fail_skips_what_follows_a_fail(images: dict[str, str], tmp_path: Path) -> None:
    body = (
        "  - id: ok\n    probe: find_spec\n    with: {modules: [json]}\n"
        "  - id: bad\n    probe: find_spec\n    with: {modules: [nosuchmodule]}\n"
        "  - id: later\n    probe: find_spec\n    with: {modules: [json]}\n"
    )
    r, attempt = _run(images["python"], tmp_path, body, head="stop_on_fail: true\n")
    assert r.returncode == 1, r.stdout + r.stderr
    st = _stages(attempt)
    assert [st[s]["status"] for s in ("ok", "bad", "later")] == ["PASS", "FAIL", "SKIPPED"]
    assert "bad" in st["later"]["detail"], st["later"]
    # without it, the later stage runs: the evidence is collected whole
    r, attempt = _run(images["python"], tmp_path / "again", body)
    assert _stages(attempt)["later"]["status"] == "PASS"


def test_expect_exit_and_output_patterns(images: dict[str, str], tmp_path: Path) -> None:
    cmd = "import sys; print('out line'); sys.stderr.write('err: ready\\\\n'); sys.exit(3)"
    body = (
        f'  - id: exits3\n    probe: cli\n    with: {{command: [python3, -c, "{cmd}"], expect_exit: 3,'
        ' stdout_regex: "^out line$", stderr_regex: "^err: ready$"}\n'
        f'  - id: wrong_exit\n    probe: cli\n    with: {{command: [python3, -c, "{cmd}"], expect_exit: 0}}\n'
        f'  - id: wrong_stderr\n    probe: cli\n    with: {{command: [python3, -c, "{cmd}"], expect_exit: 3,'
        ' stderr_regex: "^never printed$"}\n'
        f'  - id: wrong_stdout\n    probe: cli\n    with: {{command: [python3, -c, "{cmd}"], expect_exit: 3,'
        ' stdout_regex: "^never printed$"}\n'
    )
    r, attempt = _run(images["python"], tmp_path, body)
    assert r.returncode == 1, r.stdout + r.stderr
    st = _stages(attempt)
    assert st["exits3"]["status"] == "PASS", st["exits3"]
    assert st["wrong_exit"]["status"] == "FAIL" and "exit 3 (expected 0)" in st["wrong_exit"]["detail"]
    assert st["wrong_stderr"]["status"] == "FAIL" and "stderr" in st["wrong_stderr"]["detail"], st[
        "wrong_stderr"
    ]
    assert "never printed" in st["wrong_stderr"]["detail"]
    assert st["wrong_stdout"]["status"] == "FAIL" and "stdout" in st["wrong_stdout"]["detail"], st[
        "wrong_stdout"
    ]


def test_record_raw_keeps_the_unoverridden_run(images: dict[str, str], tmp_path: Path) -> None:
    body = (
        "  - id: serve\n    probe: cli\n    with:\n      command: [vllm]\n      args: [serve, --help]\n"
        "      platform: vllm-cpu\n      record_raw: true\n"
    )
    r, attempt = _run(images["vllm-like"], tmp_path, body)
    assert r.returncode == 0, r.stdout + r.stderr
    st = _stages(attempt)["serve"]
    assert st["status"] == "PASS"
    # the raw run, without the override, fails the way the image fails without a GPU: kept
    raw = st["facts"]["raw"]
    assert raw["returncode"] == 1 and "Failed to infer device type" in raw["reason"], raw
    folder = attempt / "stages/01-serve"
    assert "Failed to infer device type" in (folder / "raw.stderr.txt").read_text()
    assert {f["path"] for f in st["evidence"]} >= {
        "stages/01-serve/raw.stdout.txt",
        "stages/01-serve/raw.stderr.txt",
    }
