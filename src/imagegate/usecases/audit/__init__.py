"""Batch audits (`imagegate audit`): a list of images (each through a pipeline) and (official,
mirror) pairs (each through compare), read from an `Inventory` file, a bounded number at a time,
one result with the worst exit code. ("inventory" alone, in the code, is the in-image probe of
installed distributions; "audit" alone is the vulnerability audit of `imagegate.vulns`.)"""

from imagegate.usecases.audit.imagelist import ImageList, LoadedImageList, load
from imagegate.usecases.audit.run import BatchOptions, BatchResult, ItemResult, run_batch, worst

__all__ = [
    "BatchOptions",
    "BatchResult",
    "ImageList",
    "ItemResult",
    "LoadedImageList",
    "load",
    "run_batch",
    "worst",
]
