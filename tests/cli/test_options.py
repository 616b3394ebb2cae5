"""One declaration per option meaning: every option the CLI takes, read from the parser the
commands build, grouped by name; an option whose name means one thing has one help text
everywhere. A name with several meanings (as cosign's `--key` is a signing key to `attest` and a
public key to `verify`) is listed in MEANINGS with the commands of each, and why; a meaning
whose default differs between commands is listed in DEFAULTS, with why."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import typer.main

from imagegate.cli import load_all

# the commands that write an attempt and sign it: --key is a signing key and --out the evidence
_SIGNED = ("run", "complete", "index", "audit", "pod run", "pod collect", "fleet run", "fleet collect")
# option -> meaning -> the commands (space-joined paths) that give the name that meaning
MEANINGS: dict[str, dict[str, set[str]]] = {
    # this run's statements to the image vs. an index's statements to the index digest
    "--attach": {"image": {"run", "complete", "pod run", "pod collect"}, "index": {"index"}},
    # a verdict's statement on stdout vs. a command's data as JSON vs. a report's formats
    "--format": {
        "statement": {"run", "complete", "pod run", "pod collect"},
        "data": {
            "layers",
            "compare",
            "index",
            "cache unpack",
            "cache list",
            "fleet report",
            "fleet run",
            "fleet collect",
            "pipelines list",
        },
        "report": {"report"},
    },
    # devices for this host's sandbox vs. nvidia.com/gpu requested for a Pod
    "--gpus": {"devices": {"run", "complete"}, "pod": {"pod render", "pod run", "pod collect"}},
    # what runs in parallel: stage groups, layers, inventory items
    "--jobs": {
        "stages": {"run"},
        "layers": {"layers", "compare"},
        "items": {"audit"},
        "nodes": {"fleet run", "fleet collect"},
    },
    # the image a statement's subject must be vs. the images the admission policies guard
    "--image": {"subject": {"verify"}, "pattern": {"policies write"}},
    # how old an attached statement verify reads may be vs. the bound written into the policies
    "--max-age": {"read": {"verify"}, "policy": {"policies write"}},
    # a signing key; the public keys a chain is verified with; the signers an attach must verify
    # with; the one key a report checks; the key the written policies trust; the key public-key
    # reads; render signs nothing
    # (hidden, from older scripts)
    "--key": {
        "signing": set(_SIGNED),
        "read": {"public-key"},
        "chain": {"verify"},
        "signer": {"attach"},
        "report": {"report", "fleet report"},
        "policy": {"policies write"},
        "hidden": {"pod render"},
    },
    "--no-sign": {"sign": {"run", "complete", "audit", "pod run", "pod collect"}, "hidden": {"pod render"}},
    # the evidence folder; the folder compare writes its signed files to; keygen's file prefix;
    # the file public-key writes;
    # the folder the filled-in policies are written to
    "--out": {
        "evidence": set(_SIGNED),
        "signed files": {"compare"},
        "prefix": {"keygen"},
        "public key file": {"public-key"},
        "policy files": {"policies write"},
    },
    # --here's host interpreter vs. the interpreter inside the image a Pod runs
    "--python": {"host": {"run", "complete"}, "image": {"pod render", "pod run"}},
    # the pipeline to run vs. the one pipeline whose attached statements verify --image reads
    "--pipeline": {"run": {"run", "pod render", "pod run", "pod collect"}, "read": {"verify"}},
    # the command's own deadline vs. how long pod waits for its Pod's result
    "--timeout": {
        "deadline": {
            "run",
            "complete",
            "layers",
            "compare",
            "verify",
            "index",
            "audit",
            "cache unpack",
            "fleet run",
        },
        "pod": {"pod run", "pod collect"},
    },
}
# option -> why its meaning's default differs between commands (the help says each)
DEFAULTS = {
    "--timeout": "each command's own deadline: 5 min to verify, 30 to read layers, a run's from its stages",
    "--pull": "complete judges the engine's own copy of the image it completes; run pulls a missing one",
    "--out": "complete writes beside the attempt it completes",
    "--key": "report checks one attestation (one key, or none); the others take a list",
}


def _options() -> dict[str, list[tuple[str, str, Any]]]:
    """option name -> (command path, help, default) of each declaration."""
    load_all()
    from imagegate.cli._app import app

    found: dict[str, list[tuple[str, str, Any]]] = collections.defaultdict(list)

    def walk(cmd: Any, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])
        if not hasattr(cmd, "commands"):
            for p in cmd.params:
                if type(p).__name__.endswith("Option"):
                    found[max(p.opts, key=len)].append((" ".join(path), (p.help or "").strip(), p.default))

    walk(typer.main.get_command(app), [])
    return found


OPTIONS = _options()


def test_every_listed_command_has_the_option() -> None:
    for name, meanings in MEANINGS.items():
        have = {cmd for cmd, _, _ in OPTIONS[name]}
        listed = set().union(*meanings.values())
        assert have == listed, (
            f"{name}: the commands taking it {sorted(have)} != the ones listed {sorted(listed)}"
        )


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_one_meaning_one_help_text(name: str) -> None:
    groups = MEANINGS.get(name, {"one": {cmd for cmd, _, _ in OPTIONS[name]}})
    for meaning, commands in groups.items():
        uses = [u for u in OPTIONS[name] if u[0] in commands]
        texts = {h for _, h, _ in uses}
        assert len(texts) == 1, f"{name} ({meaning}) is declared with {len(texts)} help texts: {uses}"
        defaults = {repr(d) for _, _, d in uses}
        assert len(defaults) == 1 or name in DEFAULTS, f"{name} ({meaning}) has defaults {defaults}"
