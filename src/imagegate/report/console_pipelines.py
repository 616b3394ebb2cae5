"""`pipelines list`: the built-in pipelines, readable at 80 columns (a name line, then its
stages, the verdicts it can give and what it is for, each wrapped between words), or as JSON."""

from __future__ import annotations

import shutil
import textwrap
from typing import TYPE_CHECKING

from imagegate._support.jsontypes import JsonObject, JsonValue

if TYPE_CHECKING:
    from imagegate.pipeline import LoadedPipeline, Pipeline

INDENT = "    "


def verdicts(p: Pipeline) -> list[str]:
    """The verdicts a run of `p` can give (model.verdict): without GPUs its GPU stages are
    DEFERRED, every one of them, so one deferred verdict at most (--skip adds others)."""
    deferred = [s.id.upper() for s in p.stages if "gpu" in s.requires]
    middle = ["CPU_PASS_" + "_".join(deferred) + "_DEFERRED"] if deferred else []
    return ["PASS", *middle, "FAIL", "ERROR"]


def summary(p: Pipeline) -> str:
    """What the pipeline is for: its description's first clause (`pipelines show` has it all)."""
    text = " ".join((p.description or "").split())
    cut = min((i for i in (text.find(": "), text.find(". ")) if i > 0), default=len(text))
    return text[:cut].rstrip(".")


def document(loaded: list[LoadedPipeline]) -> JsonObject:
    """The stable JSON of `pipelines list --format json`."""
    return {
        "pipelines": [
            {
                "name": lp.pipeline.name,
                "version": lp.pipeline.version,
                "description": " ".join((lp.pipeline.description or "").split()),
                "source": lp.source,
                "stages": [
                    {
                        "id": s.id,
                        "probe": s.probe,
                        "side": s.side,
                        "requires": list(s.requires),
                        "needs": list(s.needs),
                    }
                    for s in lp.pipeline.stages
                ],
                "verdicts": list[JsonValue](verdicts(lp.pipeline)),
            }
            for lp in loaded
        ]
    }


def _wrapped(label: str, words: str, width: int) -> list[str]:
    # Between words only: a verdict or a stage name is never cut.
    return textwrap.wrap(
        words,
        width=width,
        initial_indent=f"{INDENT}{label}",
        subsequent_indent=INDENT + " " * len(label),
        break_long_words=False,
        break_on_hyphens=False,
    )


def lines(loaded: list[LoadedPipeline], width: int | None = None) -> list[str]:
    """The listing, no line wider than `width` (the terminal's, COLUMNS, else 80)."""
    width = width or shutil.get_terminal_size((80, 24)).columns
    out: list[str] = []
    for lp in loaded:
        p = lp.pipeline
        n = len(p.stages)
        out.append(f"{p.name} (version {p.version}, {n} stage{'s' if n != 1 else ''})")
        out += _wrapped("stages:   ", ", ".join(s.id for s in p.stages), width)
        out += _wrapped("verdicts: ", ", ".join(verdicts(p)), width)
        out += _wrapped("", summary(p), width)
        out.append("")
    out.append("imagegate pipelines show NAME prints one whole; run -p NAME runs it.")
    return out
