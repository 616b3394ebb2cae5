"""Errors of reading an image, below both the registry client and the image sources (which
re-export them), so that neither has to import the other for them."""

from __future__ import annotations

from imagegate.errors import ImagegateError


class SourceError(ImagegateError):
    """The image could not be read (unreachable, refused, malformed): exit 2, undecided."""


class BlobNotFound(SourceError):
    """The source has no blob with this digest (or no such archive member)."""
