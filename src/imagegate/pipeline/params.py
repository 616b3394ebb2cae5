"""Parameters of each probe (`with:` in a pipeline stage). Strict: unknown keys are errors."""

from __future__ import annotations

import ast
import datetime as dt
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from imagegate._support import resources

# A module as `import` takes it: identifiers joined by dots (`requests`, `vllm.entrypoints`).
DOTTED_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PipCheckParams(Params):
    ignore: list[str] = Field(
        default_factory=list,
        description="Distribution names whose problems are reported but do not fail the stage.",
    )


class FindSpecParams(Params):
    modules: list[str] = Field(
        default_factory=list, description="Module names; `--module` on the command line adds more."
    )
    allow_namespace: list[str] = Field(
        default_factory=list,
        description="Modules that may legitimately be namespace packages (e.g. `nvidia`); other "
        "namespace-only hits fail, since any stray folder on sys.path satisfies them.",
    )

    @field_validator("modules", "allow_namespace")
    @classmethod
    def _dotted(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(DOTTED_NAME, name):
                raise ValueError(f"{name!r} is not a dotted module name")
        return v


class VersionCase(Params):
    when: str = Field(description="Version specifier, e.g. '>=0.11' or '>=0.9,<0.11'.")
    args: list[str]
    command: list[str] | None = Field(default=None, description="Replaces the stage's target for this case.")
    module: str | None = Field(default=None, description="Replaces the stage's target for this case.")
    note: str | None = None

    @model_validator(mode="after")
    def _one_target(self) -> VersionCase:
        if self.command and self.module:
            raise ValueError("give command or module, not both")
        return self

    @field_validator("when")
    @classmethod
    def _spec(cls, v: str) -> str:
        for part in v.split(","):
            if not re.fullmatch(r"\s*(==|!=|>=|<=|>|<)\s*\d+(\.\d+)*\s*", part):
                raise ValueError(f"{v!r}: use comparisons like '>=0.11' or '>=0.9,<0.11'")
        return v


class ArgsByVersion(Params):
    distribution: str = Field(description="Installed distribution whose version picks the case.")
    cases: list[VersionCase] = Field(min_length=1)


def probe_table(module: str, name: str) -> tuple[str, ...]:
    """The keys of a literal table of the in-image side (probes/MODULE.py's NAME), parsed, never
    imported, as the runner imports nothing of the in-image side."""
    path = resources.probes_dir() / f"{module}.py"
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{path}: no {name} table")


def platform_overrides() -> tuple[str, ...]:
    """The names of the cli probe's built-in platform overrides (OVERRIDES in probes/platforms.py)."""
    return probe_table("platforms", "OVERRIDES")


PLATFORM_OVERRIDES = platform_overrides()
# The serve probe's built-in engines (ENGINES in probes/serve_engines.py).
SERVE_ENGINES = probe_table("serve_engines", "ENGINES")
SERVE_PARSE_ONLY = probe_table("serve_engines", "PARSE_ONLY")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class CliParams(Params):
    command: list[str] | None = Field(
        default=None,
        description="argv; argv[0] is a console script (run in-process through its entry point, so "
        "a platform override applies) or an executable on PATH.",
    )
    module: str | None = Field(default=None, description="Run as `python -m MODULE ARGS`.")
    entry_point: str | None = Field(default=None, description="`package.module:function`.")
    args: list[str] = Field(default_factory=list, description="Arguments after the command.")
    args_by_version: ArgsByVersion | None = Field(
        default=None, description="Pick `args` by the installed version of a distribution."
    )
    platform: str | None = Field(
        default=None,
        description="Built-in platform override run before the CLI builds its parser: "
        + ", ".join(PLATFORM_OVERRIDES)
        + ".",
    )
    platform_code: str | None = Field(
        default=None, description="Python code run in the CLI's process before it starts."
    )
    platform_checked_against: list[str] = Field(
        default_factory=list, description="Versions the override was checked against (recorded as evidence)."
    )
    expect_exit: int = 0
    stdout_regex: str | None = None
    stderr_regex: str | None = None
    record_raw: bool = Field(
        default=False, description="Also run without the override and keep that output as evidence."
    )
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_target(self) -> CliParams:
        given = [n for n in ("command", "module", "entry_point") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError("give exactly one of command, module, entry_point")
        if self.platform and self.platform_code:
            raise ValueError("give platform or platform_code, not both")
        if self.platform and self.platform not in PLATFORM_OVERRIDES:
            raise ValueError(f"unknown platform {self.platform!r}; built-in: {', '.join(PLATFORM_OVERRIDES)}")
        return self

    @field_validator("stdout_regex", "stderr_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        return None if v is None else check_regex(v)


class AvRoundtripParams(Params):
    frames: int = Field(default=8, ge=1, le=1000)
    width: int = Field(default=64, ge=16, le=4096)
    height: int = Field(default=64, ge=16, le=4096)
    codec: str = "mpeg4"


class LayersParams(Params):
    expect_config_digest: str | None = Field(
        default=None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="The official config digest; --expect-config overrides it.",
    )
    platform: str | None = Field(default=None, description="For an index: os/arch[/variant].")
    insecure: bool = Field(
        default=False, description="Registry sources: skip TLS verification, fall back to plain HTTP."
    )
    jobs: int | None = Field(default=None, ge=1, le=64, description="Layers verified in parallel.")


class InventoryParams(Params):
    """No parameters: the inventory lists every distribution the image's python can see."""


class VulnIgnore(Params):
    id: str = Field(min_length=1, description="Advisory id or one of its aliases (PYSEC-…, CVE-…, GHSA-…).")
    reason: str = Field(description="Why the finding is accepted; recorded with the finding.")
    expires: dt.date = Field(
        description="Last day (UTC) the ignore applies; after it the stage fails until it is renewed or removed."
    )
    package: str | None = Field(default=None, description="Only for this distribution (default: any).")

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("an ignore needs a reason")
        return v


class VulnsParams(Params):
    fail_on: Literal["any", "low", "medium", "high", "critical"] = Field(
        default="any",
        description="Fail on any finding, or on findings of this severity and above (CVSS v3 or the "
        "database's own rating).",
    )
    unknown_severity: Literal["fail", "pass"] = Field(
        default="fail",
        description="With a severity threshold: how a finding without a known severity counts.",
    )
    ignore: list[VulnIgnore] = Field(default_factory=list)
    advisory_db: str | None = Field(
        default=None,
        description="OSV advisory folder (YAML/JSON) for an offline audit; --advisory-db overrides it.",
    )
    service: Literal["osv", "pypi", "none"] = Field(
        default="osv",
        description="Without an advisory folder: the online service queried through pip-audit; none: "
        "offline only (the stage is DEFERRED without a folder).",
    )
    service_timeout: int = Field(default=15, ge=1, le=300, description="Seconds per request.")


class GpuPreflightParams(Params):
    """The GPU node check (probes/gpu_preflight.py). Every step is bounded by its timeout."""

    size: int = Field(default=8192, ge=256, le=65536, description="n of the n x n x n bf16 matmul per GPU.")
    warmup: int = Field(default=5, ge=0, le=1000, description="Untimed runs before the timed ones.")
    iters: int = Field(default=20, ge=1, le=10000, description="Timed runs (CUDA events).")
    min_tflops: float | None = Field(
        default=None, gt=0, description="Slowest GPU's bf16 TFLOP/s below this: the node is not fit."
    )
    min_busbw_gbps: float | None = Field(
        default=None, gt=0, description="Slowest rank's all-reduce bus bandwidth (GB/s) below this: not fit."
    )
    allreduce_bytes: int = Field(
        default=1 << 30, ge=4, le=1 << 36, description="Bytes per all-reduce (float32), with 2 or more GPUs."
    )
    facts_timeout: float = Field(
        default=120, gt=0, le=3600, description="Seconds: import torch, read the GPUs."
    )
    matmul_timeout: float = Field(
        default=300, gt=0, le=3600, description="Seconds: the matmuls on every GPU."
    )
    allreduce_timeout: float = Field(
        default=300, gt=0, le=3600, description="Seconds: NCCL init and the all-reduces, all ranks."
    )
    bandwidth_iters: int = Field(default=10, ge=1, le=1000, description="Timed copies per figure.")
    sustain_s: float = Field(
        default=3,
        ge=0,
        le=600,
        description="Seconds each GPU's matmul is held (first vs last second, clocks).",
    )
    bandwidth_bytes: int = Field(
        default=1 << 30, ge=1 << 20, le=1 << 36, description="Bytes per copy: HBM, host<->GPU, GPU<->GPU."
    )
    bandwidth_timeout: float = Field(default=300, gt=0, le=3600, description="Seconds: the copies, all GPUs.")
    min_fraction_of_limit: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A measured figure without its own threshold below this fraction of the GPU's "
        "physical limit (where known): not fit.",
    )
    min_sustained_tflops: float | None = Field(
        default=None, gt=0, description="A GPU's last-second bf16 TFLOP/s below this: not fit."
    )
    min_hbm_gbps: float | None = Field(
        default=None, gt=0, description="A GPU's HBM copy (read + write) GB/s below this: not fit."
    )
    min_h2d_gbps: float | None = Field(
        default=None, gt=0, description="A GPU's pinned host-to-GPU GB/s below this: not fit."
    )
    min_d2h_gbps: float | None = Field(
        default=None, gt=0, description="A GPU's pinned GPU-to-host GB/s below this: not fit."
    )
    min_p2p_gbps: float | None = Field(
        default=None, gt=0, description="The slowest GPU-to-GPU peer copy GB/s below this: not fit."
    )
    max_ecc_uncorrected: int = Field(
        default=0, ge=0, description="Uncorrected ECC errors since the driver loaded above this: not fit."
    )
    # DCGM's diagnostics refuse a GPU another process uses; its memory bandwidth test one whose
    # memory-controller utilization is above 10 %. A CUDA context holds about 0.5 GiB.
    max_busy_utilization_pct: float = Field(
        default=10,
        ge=0,
        le=100,
        description="A GPU whose utilization (compute or memory) in the ~1 s before any load is above "
        "this: in use by another process, ERROR before any figure.",
    )
    max_busy_used_mib: float = Field(
        default=1024,
        ge=0,
        description="A GPU with more memory used (MiB) before any load: in use by another process.",
    )


def check_regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:  # not a ValueError: pydantic would let it escape as a traceback
        raise ValueError(f"{v!r} is not a valid regular expression: {e}") from None
    return v


class ServeParams(Params):
    """The serve probe (probes/serve.py): the image's server started with a model and judged."""

    command: list[str] = Field(
        min_length=1,
        description="The server's argv; {model}, {port} and {host} are replaced (e.g. "
        "[vllm, serve, '{model}', --host, '{host}', --port, '{port}']).",
    )
    model: str | None = Field(
        default=None,
        description="The model's path in the sandbox; --model PATH mounts a host path read-only and sets it.",
    )
    served_model_name: str = Field(
        default="{model}", description="The `model` field of each request ({model}: the model path)."
    )
    host: str = Field(default="127.0.0.1", description="Loopback only: " + ", ".join(LOOPBACK) + ".")
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port picked in the sandbox.")
    ready_path: str = Field(
        default="/health", pattern=r"^/", description="Answers 200 when the server is ready."
    )
    engine: str | None = Field(
        default=None,
        description="Built-in start-up phase patterns: " + ", ".join(SERVE_ENGINES) + ".",
    )
    phases: dict[str, str] = Field(
        default_factory=dict,
        description="Phase name -> regular expression of its log line (adds to engine's).",
    )
    startup_timeout: float | None = Field(
        default=None, gt=0, le=86400, description="Seconds for readiness (default: the stage's deadline)."
    )
    request_timeout: float = Field(
        default=120,
        gt=0,
        le=3600,
        description="Seconds per request, from connect to its last byte (the streamed request too).",
    )
    max_tokens: int = Field(default=4, ge=1, le=4096)
    media: list[Literal["image", "video"]] = Field(
        default_factory=list,
        description="Media the model takes: a valid one is sent, and a corrupt one must not be ignored.",
    )
    bad_media: bool = Field(default=True, description="Send the bad-media cases (each expects a 4xx).")
    startup_probe_period: int = Field(default=10, ge=1, le=3600, description="periodSeconds recommended.")
    startup_margin: float = Field(
        default=0.5, ge=0, le=10, description="Start-up margin of the recommended probe."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Added to the server's environment.")
    parse_only: str | None = Field(
        default=None,
        description="Only parse the assembled argv with the server's own CLI under a CPU platform, start "
        "nothing (a bad flag fails before any GPU is used): " + ", ".join(SERVE_PARSE_ONLY) + ".",
    )

    @field_validator("host")
    @classmethod
    def _loopback(cls, v: str) -> str:
        if v not in LOOPBACK:
            raise ValueError(f"{v!r}: the server listens on loopback only ({', '.join(LOOPBACK)})")
        return v

    @field_validator("engine", "parse_only")
    @classmethod
    def _builtin(cls, v: str | None, info: ValidationInfo[object]) -> str | None:
        known = {"engine": SERVE_ENGINES, "parse_only": SERVE_PARSE_ONLY}[str(info.field_name)]
        if v is not None and v not in known:
            raise ValueError(f"unknown {info.field_name} {v!r}; built-in: {', '.join(known)}")
        return v

    @field_validator("phases")
    @classmethod
    def _phases(cls, v: dict[str, str]) -> dict[str, str]:
        for rx in v.values():
            check_regex(rx)
        return v
