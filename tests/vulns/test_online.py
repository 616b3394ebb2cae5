"""The online path through pip-audit's services; skipped where no service is reachable, so CI
stays offline-safe."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from imagegate.vulns import online, pip_audit_service
from imagegate.vulns.findings import Package, Unreachable


@pytest.mark.online
@pytest.mark.parametrize("service", ["osv", "pypi"])
def test_known_vulnerable_release_online(service: online.Service) -> None:
    try:
        audit = online.audit([Package("requests", "2.25.1", ("/site",))], service, timeout=10)
    except Unreachable as e:
        pytest.skip(str(e))
    hit = [f for f in audit.findings if "CVE-2023-32681" in f.ids]
    assert hit, [f.id for f in audit.findings]
    assert hit[0].package == "requests" and "2.31.0" in hit[0].fixed and hit[0].locations == ("/site",)


def test_a_service_that_knows_no_package_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake answer at the adapter's seam: a proxy or mirror that answers 404 for everything
    # cannot be started here in place of the service's fixed address.
    def knows_nothing(_service: str, distributions: Any, _timeout: int) -> Iterator[pip_audit_service.Answer]:
        for name, _version in distributions:
            yield pip_audit_service.Answer(name, "", (), skipped="not found")

    monkeypatch.setattr(pip_audit_service, "query", knows_nothing)
    with pytest.raises(Unreachable, match="knew none of 2"):
        online.audit([Package("a", "1.0"), Package("b", "2.0")], "pypi")
