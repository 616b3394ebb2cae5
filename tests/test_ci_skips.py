"""The skip list at the end of `.ci/run`: every skip named with its reason, and a skip that
README.md does not allow fails the job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _junit(tmp_path: Path, *cases: tuple[str, str, str]) -> Path:
    body = "".join(
        f'<testcase classname="{c}" name="{n}"><skipped type="pytest.skip" message="{m}"/></testcase>'
        for c, n, m in cases
    )
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def _ci_skips(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ci-skips.py"), *map(str, files)],
        capture_output=True,
        text=True,
    )


def test_the_allowed_skips_are_listed_with_their_reasons(tmp_path: Path) -> None:
    done = _ci_skips(
        _junit(
            tmp_path,
            ("tests.kube.test_real_cluster", "test_pod_run_twice_in_a_real_cluster", "no cluster: set X"),
            ("tests.vulns.test_online", "test_known_vulnerable_release_online[osv]", "osv unreachable"),
        )
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ci: 2 skipped" in done.stdout
    assert (
        "allowed  tests/vulns/test_online.py::test_known_vulnerable_release_online[osv]: osv unreachable"
        in (done.stdout)
    )


def test_a_file_the_readme_names_allows_each_of_its_tests_and_no_other_file(tmp_path: Path) -> None:
    allowed = _ci_skips(
        _junit(
            tmp_path,
            (
                "tests.kube.test_fleet_kwok",
                "test_fleet_collect_reads_the_jobs_applied_earlier",
                "not built yet",
            ),
            ("tests.kube.test_apiserver", "test_x[a]", "not built yet"),
        )
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    # a file whose name begins with an allowed one's is another file
    other = _ci_skips(_junit(tmp_path, ("tests.kube.test_fleet_kwok_more", "test_y", "not built yet")))
    assert other.returncode == 1, other.stdout
    assert "NOT ALLOWED  tests/kube/test_fleet_kwok_more.py::test_y" in other.stdout


def test_a_skip_the_readme_does_not_allow_fails_the_job(tmp_path: Path) -> None:
    done = _ci_skips(
        _junit(tmp_path, ("tests.run.test_gpu", "test_complete_refuses", "no second interpreter"))
    )
    assert done.returncode == 1
    assert "NOT ALLOWED  tests/run/test_gpu.py::test_complete_refuses: no second interpreter" in done.stdout


def test_a_run_that_wrote_no_junit_file_fails_the_job(tmp_path: Path) -> None:
    done = _ci_skips(tmp_path / "absent.xml")
    assert done.returncode == 1
    assert "absent.xml is missing: that test run did not finish" in done.stderr


def test_every_skip_the_readme_allows_names_a_test_that_exists() -> None:
    """A typo in the list would allow nothing (and a renamed test would silently stop being
    allowed): each entry names a file of the suite and, where it names one, a test in it."""
    script = load_script(ROOT / "scripts" / "ci-skips.py")
    entries = script.allowed((ROOT / "README.md").read_text())
    assert len(entries) >= 3, entries
    for entry in entries:
        file, _, name = entry.partition("::")
        assert (ROOT / file).is_file(), entry
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / file).read_text(), re.M), entry
