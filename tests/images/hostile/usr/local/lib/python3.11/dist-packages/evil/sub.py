"""A submodule, so that find_spec("evil.sub") imports the package."""
