"""pip-audit's private service interface, exactly as imagegate.vulns.pip_audit_service uses it.
pip-audit promises nothing about `pip_audit._service`: when a release changes a name or a
signature used there, this test fails and names it, before any user meets an AttributeError."""

from __future__ import annotations

import dataclasses
import inspect
import re
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imagegate.vulns import pip_audit_service

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_pip_audit_is_in_the_supported_range_pinned_in_pyproject() -> None:
    line = re.search(r'^\s*"(pip-audit[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert line is not None, "pyproject.toml lists no pip-audit"
    pinned = Requirement(line.group(1))
    assert pinned.specifier == SpecifierSet(pip_audit_service.SUPPORTED)
    assert Version(version("pip-audit")) in pinned.specifier
    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]  # where the docs say it
    assert any(f"pip-audit {pip_audit_service.SUPPORTED}" in p.read_text() for p in docs)


def test_the_names_the_adapter_imports_exist() -> None:
    import pip_audit._service as service

    for name in ("ConnectionError", "ServiceError", "OsvService", "PyPIService", "ResolvedDependency"):
        assert hasattr(service, name), f"pip_audit._service.{name} is gone"
    assert issubclass(service.ConnectionError, Exception)
    assert issubclass(service.ServiceError, Exception)


def test_the_services_take_a_timeout_and_query_all() -> None:
    from pip_audit._service import OsvService, PyPIService

    for cls in (OsvService, PyPIService):
        params = inspect.signature(cls).parameters
        assert "timeout" in params, f"{cls.__name__}(timeout=...) is gone: {list(params)}"
        query_all = inspect.signature(cls.query_all).parameters
        assert list(query_all)[:2] == ["self", "specs"], f"{cls.__name__}.query_all{list(query_all)}"
        cls(timeout=5)  # constructing one reaches no network


def test_dependencies_carry_what_the_adapter_reads() -> None:
    from pip_audit._service import ResolvedDependency, SkippedDependency

    resolved = ResolvedDependency(name="Foo_Bar", version=Version("1.0"))
    assert resolved.canonical_name == "foo-bar" and not resolved.is_skipped()
    assert resolved.version == Version("1.0")
    skipped = SkippedDependency(name="foo", skip_reason="not found")
    assert skipped.is_skipped() and skipped.skip_reason == "not found"


def test_results_carry_what_the_adapter_reads() -> None:
    from pip_audit._service import VulnerabilityResult

    fields = {f.name for f in dataclasses.fields(VulnerabilityResult)}
    assert {"id", "aliases", "fix_versions", "description"} <= fields, fields
    r = VulnerabilityResult(
        id="PYSEC-1", description=" a  hole ", fix_versions=[Version("2.0")], aliases={"CVE-1"}
    )
    assert pip_audit_service._advisory(r) == pip_audit_service.Advisory(
        "PYSEC-1", ("CVE-1",), ("2.0",), " a  hole "
    )
