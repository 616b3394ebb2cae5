"""The pipeline file (apiVersion imagegate/v1): a strict, versioned list of stages."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from imagegate.pipeline.params import Params
from imagegate.pipeline.probes import PROBES, Probe, side_of

API_VERSION = "imagegate/v1"
Requirement = Literal["gpu"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
# A stage or a run that needs more than a day is a typo (or `.inf`); past it the socket layer
# and the engine's own timers misbehave instead of saying so.
MAX_DURATION_S = 24 * 3600.0


class StageGraphError(ValueError):
    """A problem between stages (a duplicate id, an unknown `needs`), with where it is:
    `loc` is the path in the pipeline file, e.g. ("stages", 2, "needs", 0)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


def parse_duration(value: object) -> float:
    """Seconds from 90, 90.5, "90s", "5m", "1h", "500ms"."""
    if value is None:
        raise ValueError("empty; give seconds, or '90s', '5m', '1h'")
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90s', '5m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value.strip())):
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use seconds, or '90s', '5m', '1h')")
    return check_duration(seconds)


def check_duration(seconds: float) -> float:
    """A timeout or deadline: finite, positive, at most a day."""
    if not math.isfinite(seconds):
        raise ValueError(f"{seconds} is not a duration: give a finite number of seconds")
    if seconds <= 0:
        raise ValueError(f"{seconds:g} is not a duration: it must be positive")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{seconds:g}s is more than a day ({MAX_DURATION_S:g}s), the longest allowed")
    return seconds


class _StageBase(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    if TYPE_CHECKING:  # each probe's model (_stage_model) declares them, typed by the registry
        probe: str
        with_: Params

    id: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$", description="Unique; upper-cased in tokens.")
    description: str | None = None
    needs: list[str] = Field(default_factory=list, description="Earlier stages that must PASS first.")
    requires: list[Requirement] = Field(
        default_factory=list,
        description="Capabilities the stage needs; where missing it is DEFERRED (and still run for the record).",
    )
    timeout: Annotated[
        float,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION_S},
                    {"type": "string", "pattern": r"^\d+(\.\d+)?(ms|s|m|h)?$"},
                ],
                "description": "Seconds, or '90s', '5m', '1h'.",
            }
        ),
    ] = 300.0

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float:
        return parse_duration(v)

    @property
    def side(self) -> Literal["inside", "outside"]:
        return side_of(self.probe)


def _stage_model(probe: Probe) -> type[_StageBase]:
    """A probe's stage: `probe: NAME` and its parameters under `with` (required where the
    parameters have no defaults). One per registry entry: a new probe adds no class here."""
    try:
        probe.params()
        # A FieldInfo at run time: pydantic types Field() as its default, for dataclass-like use.
        with_field: object = Field(default_factory=probe.params, alias="with")
    except ValidationError:
        with_field = Field(alias="with")
    name = "".join(part.title() for part in probe.name.split("_")) + "Stage"
    return create_model(
        name,
        __base__=_StageBase,
        __module__=__name__,
        probe=(Literal[probe.name], ...),  # type: ignore[arg-type]  # a Literal made at run time
        with_=(probe.params, with_field),
    )


STAGE_MODELS: dict[str, type[_StageBase]] = {name: _stage_model(p) for name, p in PROBES.items()}

if TYPE_CHECKING:
    Stage = _StageBase
else:  # the discriminated union of every probe's stage, from the registry
    Stage = Annotated[Union[tuple(STAGE_MODELS.values())], Field(discriminator="probe")]  # noqa: UP007


class Pipeline(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, title="imagegate pipeline")

    apiVersion: Literal["imagegate/v1"]
    kind: Literal["Pipeline"] = "Pipeline"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    version: str = Field(default="1", description="The pipeline's own version, recorded in attestations.")
    description: str | None = None
    python: str | None = Field(
        default=None, description="The image's interpreter; default: the first of python3, python."
    )
    stop_on_fail: bool = Field(default=False, description="Skip the remaining stages after a FAIL.")
    stages: list[Stage] = Field(min_length=1)

    @model_validator(mode="after")
    def _graph(self) -> Pipeline:
        seen: dict[str, str] = {}
        for n, stage in enumerate(self.stages):
            if stage.id in seen:
                raise StageGraphError(
                    f"stage id {stage.id!r} is used twice; ids must be unique", ("stages", n, "id")
                )
            for k, need in enumerate(stage.needs):
                where = ("stages", n, "needs", k)
                if need not in seen:
                    raise StageGraphError(
                        f"stage {stage.id!r} needs {need!r}, which is not an earlier stage "
                        f"(earlier: {', '.join(seen) or 'none'})",
                        where,
                    )
                if stage.side == "inside" and seen[need] == "outside":
                    raise StageGraphError(
                        f"stage {stage.id!r} runs in the image and cannot need the outside stage {need!r}",
                        where,
                    )
            seen[stage.id] = stage.side
        return self
