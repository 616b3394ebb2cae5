"""The online path through pip-audit's services; skipped where no service is reachable, so CI
stays offline-safe."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from imagegate.vulns import online
from imagegate.vulns.model import Package, Unreachable


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
    from pip_audit._service import SkippedDependency

    class NotFound:
        def query_all(self, specs: Iterator[Any]) -> Iterator[tuple[Any, list[Any]]]:
            for s in specs:
                yield SkippedDependency(name=s.name, skip_reason="not found"), []

    monkeypatch.setattr(online, "_service", lambda *_a: NotFound())
    with pytest.raises(Unreachable, match="knew none of 2"):
        online.audit([Package("a", "1.0"), Package("b", "2.0")], "pypi")
