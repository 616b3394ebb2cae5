"""Offline matching: OSV range semantics, and the real advisory data against real releases."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from imagegate.vulns.findings import AuditError, Package
from imagegate.vulns.osv import AdvisoryDB, BadRange, in_range, in_versions, match_affected, upgrades


def affected(v: str, *events: dict[str, str]) -> bool:
    return in_range(Version(v), list(events))


@pytest.mark.parametrize(
    ("version", "hit"),
    [("0.1", True), ("1.9.9", True), ("2.0", False), ("2.0.1", False), ("2.0rc1", True), ("0.dev0", True)],
)
def test_introduced_zero_fixed(version: str, hit: bool) -> None:
    assert affected(version, {"introduced": "0"}, {"fixed": "2.0"}) is hit


@pytest.mark.parametrize(
    ("version", "hit"),
    [("1.0", False), ("1.1rc1", False), ("1.1", True), ("1.1.post1", True), ("1.4", True), ("1.5", False)],
)
def test_introduced_is_inclusive_fixed_exclusive(version: str, hit: bool) -> None:
    assert affected(version, {"introduced": "1.1"}, {"fixed": "1.5"}) is hit


@pytest.mark.parametrize(
    ("version", "hit"), [("2.1.214", True), ("2.1.215", False), ("2.1.214.post1", False)]
)
def test_last_affected_is_inclusive(version: str, hit: bool) -> None:
    assert affected(version, {"introduced": "0"}, {"last_affected": "2.1.214"}) is hit


@pytest.mark.parametrize(
    ("version", "hit"), [("1.0.1", True), ("1.0.2", False), ("2.9", False), ("3.1", True)]
)
def test_several_intervals_in_one_range_and_unsorted_events(version: str, hit: bool) -> None:
    events = [{"introduced": "3.0.0"}, {"fixed": "3.2.5"}, {"introduced": "1.0.0"}, {"fixed": "1.0.2"}]
    assert affected(version, *events) is hit


def test_introduced_without_fix_affects_everything_after() -> None:
    assert affected("99.0", {"introduced": "1.0"})
    assert not affected("0.9", {"introduced": "1.0"})


def test_limit_events_bound_the_range() -> None:
    assert affected("1.5", {"introduced": "1.0"}, {"limit": "2.0"})
    assert not affected("2.0", {"introduced": "1.0"}, {"limit": "2.0"})
    assert affected("7.0", {"introduced": "1.0"}, {"limit": "*"})


def test_prerelease_of_the_fix_is_still_affected() -> None:
    # A pre-release sorts before its release: 2.31.0rc1 does not have the fix of 2.31.0.
    assert affected("2.31.0rc1", {"introduced": "2.3.0"}, {"fixed": "2.31.0"})
    assert not affected("2.31.0", {"introduced": "2.3.0"}, {"fixed": "2.31.0"})


def test_unparseable_bound_is_reported_and_versions_list_still_matches() -> None:
    with pytest.raises(BadRange, match="range bound '2019-09-12' is not a PEP 440 version"):
        affected("1.0", {"introduced": "0"}, {"fixed": "2019-09-12"})
    entry = {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.2.0-n653"}]}]}
    m = match_affected("0.1", entry)
    assert not m.affected and "0.2.0-n653" in m.problems[0]
    m = match_affected("0.1", {**entry, "versions": ["0.1"]})
    assert m.affected


def test_versions_list_compares_as_pep440() -> None:
    assert in_versions("3.1.0rc1", ["3.1.0.rc1"])
    assert in_versions("1.0", ["1.0.0"])
    assert not in_versions("1.0.1", ["1.0"])
    assert in_versions("0.9-doduo", ["0.9-doduo"])  # not PEP 440: string equality


def test_git_ranges_are_left_to_the_versions_list() -> None:
    entry = {"ranges": [{"type": "GIT", "events": [{"introduced": "0"}, {"fixed": "deadbeef"}]}]}
    assert not match_affected("1.0", entry).affected


def test_fixed_lists_the_upgrades_only() -> None:
    assert upgrades("1.5", ["1.2.5", "2.3.1", "1.6", "not-a-version"]) == ("1.6", "2.3.1")


def test_names_are_normalised_on_both_sides(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(
        '{"id": "TEST-1", "modified": "2024-01-01T00:00:00Z", "aliases": ["CVE-0000-1"],'
        ' "affected": [{"package": {"ecosystem": "PyPI", "name": "Zope.Interface"},'
        ' "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "5.0"}]}]}]}'
    )
    (tmp_path / "withdrawn.yaml").write_text(
        "id: TEST-2\nwithdrawn: '2024-01-02T00:00:00Z'\naffected:\n- package: {ecosystem: PyPI, name: zope-interface}\n"
        "  ranges: [{type: ECOSYSTEM, events: [{introduced: '0'}]}]\n"
    )
    db = AdvisoryDB.load(tmp_path)
    audit = db.audit([Package("zope_interface", "4.7.2", ("/site",))])
    assert [(f.id, f.package, f.aliases, f.fixed) for f in audit.findings] == [
        ("TEST-1", "zope-interface", ("CVE-0000-1",), ("5.0",))
    ]


def test_aliases_of_each_other_merge_into_one_finding(tmp_path: Path) -> None:
    for vid, alias in (("PYSEC-1", "GHSA-1"), ("GHSA-1", "PYSEC-1")):
        (tmp_path / f"{vid}.json").write_text(
            f'{{"id": "{vid}", "aliases": ["{alias}"], "affected": [{{"package": {{"ecosystem": "PyPI",'
            f' "name": "a"}}, "versions": ["1.0"]}}]}}'
        )
    findings = AdvisoryDB.load(tmp_path).audit([Package("a", "1.0")]).findings
    assert len(findings) == 1 and findings[0].ids == {"PYSEC-1", "GHSA-1"}


def test_an_empty_or_missing_folder_is_an_error_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="no PyPI advisories"):
        AdvisoryDB.load(tmp_path)
    with pytest.raises(AuditError, match="no such folder"):
        AdvisoryDB.load(tmp_path / "missing")


# The real PyPA advisory data.


@pytest.fixture(scope="module")
def pypa(advisory_db: Path) -> AdvisoryDB:
    return AdvisoryDB.load(advisory_db)


def ids(db: AdvisoryDB, name: str, version: str) -> set[str]:
    return {f.id for f in db.audit([Package(name, version)]).findings}


def test_real_data_known_vulnerable_releases(pypa: AdvisoryDB) -> None:
    assert {"PYSEC-2023-175", "PYSEC-2023-227"} <= ids(pypa, "Pillow", "9.5.0")
    assert "PYSEC-2023-74" in ids(pypa, "requests", "2.25.1")
    assert ids(pypa, "pip", "23.0.1") == {"PYSEC-2023-228"}


def test_real_data_fixed_and_current_releases(pypa: AdvisoryDB) -> None:
    assert ids(pypa, "pillow", "12.2.0") == set()
    assert ids(pypa, "requests", "2.31.0") == set()
    assert ids(pypa, "pip", "23.3") == set()
    # introduced 2.3.0: requests 2.2.1 has the older advisories but not PYSEC-2023-74.
    assert "PYSEC-2023-74" not in ids(pypa, "requests", "2.2.1")


def test_real_data_last_affected(pypa: AdvisoryDB) -> None:
    # PYSEC-2022-42969: py, every release up to and including 1.11.0.
    assert "PYSEC-2022-42969" in ids(pypa, "py", "1.11.0")
    assert "PYSEC-2022-42969" not in ids(pypa, "py", "1.11.1")


def test_real_data_finding_fields(pypa: AdvisoryDB) -> None:
    (f,) = [
        f for f in pypa.audit([Package("requests", "2.25.1", ("/x",))]).findings if f.id == "PYSEC-2023-74"
    ]
    assert f.aliases == ("CVE-2023-32681", "GHSA-j8r2-6x86-q33q")
    assert (f.package, f.version, f.fixed, f.locations) == ("requests", "2.25.1", ("2.31.0",), ("/x",))
