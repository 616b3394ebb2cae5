"""Batch audits: an inventory of images (each through a pipeline) and (official, mirror) pairs
(each through compare), a bounded number at a time, one result with the worst exit code."""

from imagegate.audit.batch import AuditOptions, AuditResult, ItemResult, audit, to_json, worst
from imagegate.audit.inventory import Inventory, LoadedInventory, load

__all__ = [
    "AuditOptions",
    "AuditResult",
    "Inventory",
    "ItemResult",
    "LoadedInventory",
    "audit",
    "load",
    "to_json",
    "worst",
]
