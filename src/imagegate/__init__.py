"""imagegate: accept or reject a container image before it reaches GPUs."""

try:  # written by the build from git (pyproject.toml: hatch-vcs, setuptools-scm's version)
    from imagegate._version import __version__ as __version__
except ImportError:  # a source tree never built nor installed
    __version__ = "0.0.0+unknown"


def version_line() -> str:
    """What --version says: the version, and the commit it was built from. setuptools-scm names
    the commit in the version's local part (+g<commit>, .dYYYYMMDD for uncommitted changes) unless
    the commit is a release tag's, which the version then names."""
    _, _, local = __version__.partition("+")
    commit, _, dirty = local.partition(".")
    if not commit.startswith("g"):
        return f"imagegate {__version__}"
    changes = ", with uncommitted changes" if dirty.startswith("d") else ""
    return f"imagegate {__version__} (commit {commit[1:]}{changes})"
