"""scripts/consumers.py's own promises: a test whose Go tool is not built skips under
IMAGEGATE_TEST_BUILD_TOOLS=0 instead of building it, and the shared Go caches over their budget
lose the build cache, never the modules (the tests read CRDs from them) or the binaries; a tool
built from its wrapper module's own main package is built again when that package changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, go_tools, load_script


def test_over_the_budget_the_build_cache_goes_and_the_modules_stay(tmp_path: Path) -> None:
    script = load_script(ROOT / "scripts" / "consumers.py")
    script.GO_CACHE = tmp_path
    compiled = tmp_path / "build" / "0a" / "0a1b-a"
    compiled.parent.mkdir(parents=True)
    compiled.write_bytes(b"x" * 4096)
    module = tmp_path / "mod" / "example.com" / "m@v1.0.0" / "crd.yaml"
    module.parent.mkdir(parents=True)
    module.write_text("kind: CustomResourceDefinition\n")
    script.trim(budget=10**9)  # under it: nothing goes
    assert compiled.exists()
    script.trim(budget=1024)
    assert not compiled.exists() and module.exists()


def test_a_tool_not_built_skips_when_building_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGEGATE_TEST_BUILD_TOOLS", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: nothing built
    with pytest.raises(pytest.skip.Exception, match=r"kwok v\S+: not built yet .*--tool kwok"):
        go_tools("kwok")


def test_a_harness_of_the_wrapper_modules_own_is_stamped_with_its_source(tmp_path: Path) -> None:
    script = load_script(ROOT / "scripts" / "consumers.py")
    vault = script.named("vault")
    assert (vault.package, vault.exe, vault.version) == (".", "vault-transit", "v1.21.4")
    script.ROOT = tmp_path  # a copy of the module, in a repository of its own
    shutil.copytree(ROOT / "tests" / "consumers" / "vault", vault.folder)
    before = vault.stamp()
    main = vault.folder / "main.go"
    main.write_text(main.read_text() + "\n// changed\n")
    assert vault.stamp() != before  # a changed harness is built again
    assert script.named("cosign").package == "tool"  # the others build their go.mod's tool lines


def test_go_keeps_everything_it_writes_in_the_shared_cache() -> None:
    """Modules, builds, the checksum database's cache (GOPATH's pkg/sumdb, else ~/go): all in
    the one cache the budget trims, nothing in the user's home."""
    import subprocess

    script = load_script(ROOT / "scripts" / "consumers.py")
    env = {**script._go_env(script.named("cosign")), "GOTOOLCHAIN": "local"}
    said = subprocess.run(
        [script._go(), "env", "GOPATH", "GOMODCACHE", "GOCACHE"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(said) == 3 and all(Path(p).is_relative_to(script.GO_CACHE) for p in said), said
