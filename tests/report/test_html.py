"""The HTML report in a real browser (Debian's chromium, headless): the page renders with no
console message (no blocked fetch, no script error), shows the verdict in its colour, the timeline,
the reasons, the layer table and evidence links that resolve. Screenshots are kept in
$IMAGEGATE_SCREENSHOTS when set (to look at them), else in the test's temporary folder."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from imagegate.report import html, load
from tests.helpers import cli_stage, imagegate, pipeline_file

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


@dataclass
class Page:
    dom: str
    console: list[str]  # every console message the page caused
    pixels: list[tuple[int, int, int]]  # the screenshot, row after row


def _png_pixels(data: bytes) -> list[tuple[int, int, int]]:
    """RGB(A) 8-bit PNG -> pixels (enough for chromium's screenshots)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    channels = 4
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, _h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6)
            channels = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, prev = zlib.decompress(idat), width * channels, bytearray(width * channels)
    out: list[tuple[int, int, int]] = []
    for row in range(len(raw) // (stride + 1)):
        ftype, line = (
            raw[row * (stride + 1)],
            bytearray(raw[row * (stride + 1) + 1 : (row + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2}.get(ftype)
            if pred is None:  # Paeth
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + pred) & 0xFF
        out += [tuple(line[i : i + 3]) for i in range(0, stride, channels)]  # type: ignore[misc]
        prev = line
    return out


def open_in_chromium(page: Path, shot: Path, tmp: Path) -> Page:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail(
            "Debian's chromium is not installed: apt-get install chromium (.ci/apt-packages.txt lists it)"
        )
    url = page.resolve().as_uri()

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a fresh profile each time
        return subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={profile}", *extra, url],
            capture_output=True,
            text=True,
            timeout=120,
        )

    shot_run = run("--window-size=1280,2200", "--hide-scrollbars", f"--screenshot={shot}")
    dom_run = run("--dump-dom")
    assert shot.is_file(), shot_run.stderr[-2000:]
    console = [line for r in (shot_run, dom_run) for line in r.stderr.splitlines() if ":CONSOLE" in line]
    return Page(dom_run.stdout, console, _png_pixels(shot.read_bytes()))


def problems(page: Page, verdict: str) -> list[str]:
    """What makes a report page wrong: console messages, fetches, a missing or invisible verdict."""
    found = [f"console: {line}" for line in page.console]
    found += [f"fetches {m}" for m in re.findall(r'(?:src|href)="((?:https?:)?//[^"]*)"', page.dom)]
    m = re.search(r'<div id="verdict"[^>]*data-verdict="([^"]*)"[^>]*>([^<]*)</div>', page.dom)
    if m is None or m.group(1) != verdict or m.group(2) != verdict:
        found.append(f"verdict {verdict} not shown")
    else:
        rgb = html.verdict_color(verdict).lstrip("#")
        colour = tuple(int(rgb[i : i + 2], 16) for i in (0, 2, 4))
        # The verdict badge is the page's largest block of its colour: at least 300x30 pixels.
        if sum(1 for p in page.pixels if p == colour) < 9000:
            found.append(f"verdict colour {colour} hardly on screen")
    return found


def shots_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get("IMAGEGATE_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_mixed_run_renders_in_chromium(mixed_attempt: Path, tmp_path: Path) -> None:
    out = tmp_path / "site" / "report.html"
    r = imagegate("report", str(mixed_attempt), "--format", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = open_in_chromium(out, shots_dir(tmp_path) / "report-mixed.png", tmp_path)
    assert problems(page, "FAIL") == []
    assert 'id="timeline"' in page.dom
    assert page.dom.count('class="bar"') == 6
    assert 'id="layers"' in page.dom and "DIFFID_MISMATCH" in page.dom
    assert "c &lt;3&gt; &amp; d|e" in page.dom  # reasons shown as text, never as markup
    hrefs = [unquote(h) for h in re.findall(r'<a href="([^"]+)"', page.dom)]
    assert hrefs and all((out.parent / h).is_file() for h in hrefs)
    assert any(h.endswith("stages/03-gpu_cli/stderr.txt") for h in hrefs)


def test_real_run_page(here_run: Path, tmp_path: Path) -> None:
    page_file = here_run / "reports/report.html"
    page = open_in_chromium(page_file, shots_dir(tmp_path) / "report-here.png", tmp_path)
    assert problems(page, "PASS") == []
    assert 'id="layers"' not in page.dom  # no layers stage in this pipeline, no table
    hrefs = [unquote(h) for h in re.findall(r'<a href="([^"]+)"', page.dom)]
    assert hrefs and all((page_file.parent / h).is_file() for h in hrefs)


def test_the_check_catches_a_broken_page(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{html.CSP}"></head>'
        '<body><div id="verdict" data-verdict="PASS">PASS</div>'
        '<img src="http://127.0.0.1:9/x.png"><script>throw new Error("boom")</script></body></html>'
    )
    found = problems(open_in_chromium(bad, tmp_path / "bad.png", tmp_path), "PASS")
    assert any("console" in f for f in found)
    assert any(f.startswith("fetches http://127.0.0.1:9/x.png") for f in found)
    assert any("hardly on screen" in f for f in found)  # no badge colour: not visibly shown


def test_page_is_self_contained(mixed_attempt: Path) -> None:
    text = html.render(load.load_attempt(mixed_attempt))
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert f'content="{html.CSP}"' in text


SLEEP = "import time; time.sleep(2)"


def _side_by_side(tmp: Path) -> Path:
    stages = [
        cli_stage("slow_a", SLEEP),
        cli_stage("slow_b", SLEEP),
        "{id: layers, probe: layers, timeout: 5m}",
    ]
    return pipeline_file(tmp / "side-by-side.yaml", "side-by-side", stages)


def _bars(dom: str) -> dict[str, tuple[float, float]]:
    """stage id -> (left %, width %) of its timeline bar, as the browser got the page."""
    found = re.findall(
        r"<code>([^<]+)</code> <span[^>]*>[A-Z]+</span></div>\s*<div class=\"track\"[^>]*>"
        r'<div class="bar" style="left:([0-9.]+)%;width:([0-9.]+)%',
        dom,
    )
    return {sid: (float(left), float(width)) for sid, left, width in found}


def test_real_run_page_tells_the_truth(images: dict[str, str], tmp_path: Path) -> None:
    """A real run (docker, two stages at once, the layers stage beside them, signed): the page
    has the layer table the stage wrote, draws the two stages that ran side by side overlapping,
    and says the attestation was signed and its signature verified."""
    key = tmp_path / "k"
    assert imagegate("keygen", "--out", str(key)).returncode == 0
    page_file = tmp_path / "reports" / "report.html"
    r = imagegate(
        "run", images["python"], "-p", str(_side_by_side(tmp_path)), "-j", "2", "-o", str(tmp_path / "runs"),
        "--key", f"{key}.key", "--report", f"html={page_file}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    page = open_in_chromium(page_file, shots_dir(tmp_path) / "report-side-by-side.png", tmp_path)
    assert problems(page, "PASS") == []
    assert 'id="layers"' in page.dom and page.dom.count("<tr><td>") >= 1, "no layer table"
    bars = _bars(page.dom)
    (a0, aw), (b0, bw) = bars["slow_a"], bars["slow_b"]
    assert a0 < b0 + bw and b0 < a0 + aw, f"slow_a and slow_b ran at once but are drawn apart: {bars}"
    assert 'id="provenance"' in page.dom and 'data-signature="verified"' in page.dom
    assert "signature verified with key" in page.dom
