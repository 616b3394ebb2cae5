"""Where images come from (registries, the engine, archives, OCI layouts) and how their bytes are verified."""

import sys

# httpx's package imports its own command-line client whenever click, rich and pygments are
# installed, as they are beside typer: ~50 ms of rich.progress, rich.syntax and pygments' lexers
# that a registry client never uses. A None entry makes that import fail, which httpx expects
# (it then defines a `main` that says the client is not installed). Before any httpx import here.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
