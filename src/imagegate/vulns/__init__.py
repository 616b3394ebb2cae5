"""Vulnerability audit of the image's Python distributions.

The inventory comes from the in-image `inventory` probe (`inventory.py` reads it); advisories come
from an OSV folder offline (`osv.py`) or from a service through pip-audit online (`online.py`);
`policy.py` decides what fails; `stage.py` is the outside `vulns` stage tying them together."""

from __future__ import annotations

from imagegate.vulns.findings import AuditError, Finding, Package, Unreachable

__all__ = ["AuditError", "Finding", "Package", "Unreachable"]
