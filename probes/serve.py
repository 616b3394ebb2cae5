"""serve: the image's server answers with a model, within a start-up budget.

Starts the server command from the image (argv with {model}, {port}, {host} placeholders, on
loopback only), with the model from a path, and within the stage's deadline:
- start-up timeline: seconds to listen, to readiness (the configured path answering 200), to the
  first token of a real request; start-up phases found in the server's log by per-engine
  patterns (serve_engines.py), each with its time; a recommended Kubernetes startupProbe;
- readiness truth: readiness answering while a real 1-token request still fails is named;
- functional checks through the OpenAI API: a chat completion with text, a streamed one, and an
  image and a video when the pipeline says the model takes them;
- bad media: each case (serve_media.py) expects a 4xx; a 5xx, "200 with empty content", or
  corrupt media taken as if it were valid fail, naming the case, the status and the server's own
  error line. A 200 is told apart by the prompt's token count: equal to the same text without
  media means the media was ignored (accepted for a text-only model), larger means it was taken;
- recovery after every bad request: the process alive, readiness answering, the next request
  answered;
- the server's whole log (bounded head and tail) kept as evidence; its process group killed at
  the end or at the deadline, and checked empty.
The judgement is in pure functions below, tested without a server.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time

from . import capture, serve_http, serve_media
from .serve_engines import ENGINES, PARSE_ONLY
from .serve_process import Server

POLL_S = 0.05  # readiness is noticed within this of the server's first 200
PROMPT = "Describe this."


class Run:
    """One serve stage: its parameters, where the server listens, what was found."""

    def __init__(self, params: dict, deadline: float) -> None:
        self.params = params
        self.deadline = deadline
        self.host = params.get("host", "127.0.0.1")
        self.port = int(params.get("port") or serve_http.free_port(self.host))
        self.model = params.get("model")
        name = params.get("served_model_name") or "{model}"
        self.served = name.replace("{model}", self.model or "")
        self.problems = []  # (status, text)
        self.data = {
            "host": self.host,
            "port": self.port,
            "model": self.model,
            "served_model_name": self.served,
        }
        self.server = None

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.deadline - time.monotonic()))

    def fail(self, text: str, status: str = "FAIL") -> None:
        self.problems.append((status, text))

    def get(self, path: str, timeout: float = 2.0):
        return serve_http.request(self.host, self.port, "GET", path, None, self.left(timeout))

    def chat(self, content, max_tokens=None, timeout=None):
        body = {
            "model": self.served,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": int(max_tokens or self.params.get("max_tokens", 4)),
            "temperature": 0,
        }
        return serve_http.request(
            self.host, self.port, "POST", "/v1/chat/completions", body, self.budget(timeout)
        )

    def budget(self, timeout=None) -> float:
        """Seconds one request may take: its own timeout (the pipeline's request_timeout), never
        past the stage's deadline."""
        return self.left(timeout or float(self.params.get("request_timeout", 120)))


def fill(argv, model, host: str, port: int) -> list:
    out = []
    for a in argv:
        a = str(a).replace("{host}", host).replace("{port}", str(port))
        out.append(a.replace("{model}", model or ""))
    return out


def model_problem(path, argv=()) -> str:
    """Why the model path cannot be served ("" when it can), said before the server starts."""
    if not path:
        if any("{model}" in str(a) for a in argv):
            return "the server's command names {model} but no model was given: give --model PATH (or model:)"
        return ""
    if not os.path.exists(path):
        return "model path %s does not exist in the sandbox: mount it (--model) or fix `model:`" % path
    if not os.access(path, os.R_OK) or (os.path.isdir(path) and not os.access(path, os.X_OK)):
        return "model path %s is not readable by uid %d: make it world-readable" % (path, os.getuid())
    return ""


def phases_of(params: dict) -> list:
    table = dict((k, v[1]) for k, v in ENGINES.get(params.get("engine") or "", {}).items())
    table.update(params.get("phases") or {})
    return sorted(table.items())


def launcher(argv: list) -> tuple:
    """-> (what cli.build runs, its arguments): `python3 -m MODULE ARGS` runs MODULE in-process
    (how `python3 -m sglang.launch_server` is started), anything else the console script that
    argv[0] names (`vllm serve`, `sglang serve`)."""
    if len(argv) > 2 and os.path.basename(argv[0]).startswith("python") and argv[1] == "-m":
        return {"module": argv[2]}, argv[3:]
    return {"command": argv[:1]}, argv[1:]


def parse_only(params: dict) -> dict:
    """The assembled argv parsed by the server's own CLI under a CPU platform, nothing started:
    a bad flag fails here, before any GPU is used."""
    from . import cli
    from .platforms import OVERRIDES

    check = PARSE_ONLY[params["parse_only"]]
    model = params.get("model") or "/tmp/imagegate-model"
    argv = fill(params["command"], model, params.get("host", "127.0.0.1"), int(params.get("port") or 8000))
    data = {"argv": argv, "parse_only": params["parse_only"], "platform": check["platform"]}
    try:
        target, args = launcher(argv)
        run_argv, how = cli.build(target, args, OVERRIDES[check["platform"]] + check["code"])
    except LookupError as e:
        return {"status": "FAIL", "detail": str(e), "data": data}
    done = capture.run(run_argv, timeout=capture.child_timeout(), env=dict(os.environ), new_group=False)
    err = done.err.text()
    sys.stderr.write(err)
    data.update(how=how, returncode=done.returncode, timed_out=done.timed_out)
    status, why = parse_verdict(done.returncode, done.timed_out, err, check["platform"])
    return {"status": status, "detail": "%s: %s" % (" ".join(argv), why), "data": data}


# Lines the PARSE_ONLY code writes: the parse ran to its end, or the argv was left unparsed
# (a server part the check does not cover was selected); either way nothing was started.
PARSED = "imagegate: parsed, not started"
NOT_PARSED = "imagegate: not parsed: "


def parse_verdict(returncode, timed_out: bool, err: str, platform: str) -> tuple:
    """-> (status, why) of a parse-only run from its exit and its stderr."""
    from .cli import last_exception

    if timed_out:
        return "ERROR", "parsing timed out (killed)"
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    unparsed = [ln for ln in lines if ln.startswith(NOT_PARSED)]
    if unparsed:
        return "ERROR", unparsed[-1][len("imagegate: ") :][:300]
    if returncode != 0:
        why = last_exception(err) or (lines or ["no output"])[-1]
        return "FAIL", "exit %s: %s" % (returncode, why[:300])
    if not any(ln.startswith(PARSED) for ln in lines):
        return "ERROR", "exit 0 without an %r line: the CLI ended before its parse" % PARSED
    return "PASS", "parsed under platform %s" % platform


def run(params: dict) -> dict:
    if params.get("parse_only"):
        return parse_only(params)
    r = Run(params, time.monotonic() + capture.child_timeout())
    problem = model_problem(r.model, params["command"])
    if problem:
        return {"status": "ERROR", "detail": problem, "data": r.data}
    argv = fill(params["command"], r.model, r.host, r.port)
    r.data["argv"] = argv
    if shutil.which(argv[0]) is None:
        return {"status": "FAIL", "detail": "%s: not found on PATH" % argv[0], "data": r.data}
    env = dict(os.environ)
    env.update(params.get("env") or {})
    r.server = Server(argv, env, os.getcwd(), phases_of(params))
    try:
        steps(r)
    finally:
        r.data["stopped"] = stopped = r.server.stop()
        r.data["phases"] = dict(r.server.seen)
    if stopped["left_alive"]:
        r.fail("processes of the server outlived it: %s" % stopped["left_alive"], "ERROR")
    artifacts = {"server.log": r.server.log_text()}
    status, detail = verdict(r.problems, r.data)
    return {"status": status, "detail": detail, "data": r.data, "artifacts": artifacts}


def steps(r: Run) -> None:
    if not startup(r) or not readiness_truth(r):
        return
    timeline = r.data["timeline"]
    at = r.server.elapsed()
    streamed = serve_http.stream(r.host, r.port, "/v1/chat/completions", stream_body(r), r.budget())
    if streamed["first_token_s"] is not None:
        timeline["first_token_s"] = round(at + streamed["first_token_s"], 3)
    functional(r, streamed)
    r.data["startup_probe"] = startup_probe(
        max(timeline["ready_s"], timeline.get("serving_s") or 0.0),
        int(r.params.get("startup_probe_period", 10)),
        float(r.params.get("startup_margin", 0.5)),
    )
    if r.params.get("bad_media", True):
        bad_media(r)


def startup(r: Run) -> bool:
    """Poll until the readiness path answers 200, within the start-up budget."""
    budget = float(r.params.get("startup_timeout") or 1e9)
    timeline = r.data["timeline"] = {}
    path = r.params.get("ready_path", "/health")
    while r.server.alive() and r.server.elapsed() < budget and r.left(1) > 0:
        if "listen_s" not in timeline and serve_http.listening(r.host, r.port):
            timeline["listen_s"] = round(r.server.elapsed(), 3)
        if "listen_s" in timeline and r.get(path, 1.0).status == 200:
            timeline["ready_s"] = round(r.server.elapsed(), 3)
            return True
        time.sleep(POLL_S)
    r.fail(not_ready(r, budget, path))
    return False


def not_ready(r: Run, budget: float, path: str) -> str:
    code = r.server.proc.poll()
    why = r.server.error_line(0.0, settle=0.5) or "no error line in its log"
    if code is not None:
        return "the server exited %s after %.1fs, before %s answered: %s" % (
            code,
            r.server.elapsed(),
            path,
            why,
        )
    where = "listening" if "listen_s" in r.data["timeline"] else "not listening"
    limit = "its start-up budget (%gs)" % budget if r.server.elapsed() >= budget else "the stage's deadline"
    return "%s did not answer 200 within %s (%s on port %d): %s" % (path, limit, where, r.port, why)


def readiness_truth(r: Run) -> bool:
    """A real 1-token request right after readiness: when it fails, readiness lied; keep trying
    to find when the server really serves."""
    first = r.chat(PROMPT, max_tokens=1)
    text, _ = serve_http.chat_text(first)
    truth = r.data["readiness"] = {"first_request": first.said()[:300], "early": False}
    if first.status == 200 and text is not None:
        return True
    truth["early"] = True
    ready_s = r.data["timeline"]["ready_s"]
    while r.left(1) > 0 and r.server.alive():
        time.sleep(0.5)
        answer = r.chat(PROMPT, max_tokens=1)
        if answer.status == 200 and serve_http.chat_text(answer)[0] is not None:
            r.data["timeline"]["serving_s"] = round(r.server.elapsed(), 3)
            r.fail(
                "readiness answered at %.1fs while a 1-token request failed (%s); it served from %.1fs"
                % (ready_s, first.said()[:200], r.data["timeline"]["serving_s"])
            )
            return True
    r.fail("readiness answered at %.1fs but no request was served: %s" % (ready_s, first.said()[:200]))
    return False


def stream_body(r: Run) -> dict:
    return {
        "model": r.served,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": int(r.params.get("max_tokens", 4)),
        "temperature": 0,
        "stream": True,
    }


def functional(r: Run, streamed: dict) -> None:
    """Chat with text, the streamed answer, and each medium the model takes (a valid one)."""
    answer = r.chat(PROMPT)
    text, tokens = serve_http.chat_text(answer)
    r.data["baseline_prompt_tokens"] = tokens
    checks = r.data["functional"] = [{"check": "chat", "status": answer.status, "text": text}]
    if answer.status != 200 or not text:
        r.fail("chat completion: %s" % ("200 with empty content" if answer.status == 200 else answer.said()))
    checks.append({k: streamed[k] for k in ("status", "first_token_s", "text", "done", "events", "error")})
    checks[-1]["check"] = "stream"
    if streamed["status"] != 200 or not streamed["text"] or not streamed["done"]:
        r.fail(
            "streamed chat completion: status %s, %d events, text %r, finished %s%s"
            % (
                streamed["status"],
                streamed["events"],
                streamed["text"][:40],
                streamed["done"],
                ": " + streamed["error"] if streamed["error"] else "",
            )
        )
    for kind in r.params.get("media") or []:
        valid_medium(r, kind, tokens)


def valid_medium(r: Run, kind: str, baseline) -> None:
    try:
        url = (
            serve_media.data_url("image/png", serve_media.png())
            if kind == "image"
            else (serve_media.data_url("video/mp4", serve_media.mp4()))
        )
    except ImportError as e:
        r.fail("a valid %s could not be made in the image: %s" % (kind, e), "ERROR")
        return
    since = r.server.elapsed()
    answer = r.chat([{"type": "text", "text": PROMPT}, serve_media.part(kind, url)])
    text, tokens = serve_http.chat_text(answer)
    check = {"check": kind, "status": answer.status, "text": text, "prompt_tokens": tokens}
    r.data["functional"].append(check)
    if answer.status != 200 or not text:
        # The server's own line says why (a decoder it cannot load, a form it does not read).
        check["server_line"] = line = r.server.error_line(since, settle=0.5)
        r.fail(
            "a valid %s: %s%s"
            % (
                kind,
                "200 with empty content" if answer.status == 200 else answer.said(),
                "; server: " + line if line else "",
            )
        )
    elif tokens is not None and tokens == baseline:
        r.fail("a valid %s was ignored: the prompt counted %s tokens, as the text alone" % (kind, tokens))


def bad_media(r: Run) -> None:
    """Each bad case expects a 4xx; after each, the server must recover."""
    cases = r.data["bad_media"] = []
    takes = set(r.params.get("media") or [])
    for name, kind, part in serve_media.bad_cases(serve_http.free_port(r.host)):
        since = r.server.elapsed()
        answer = r.chat([{"type": "text", "text": PROMPT}, part])
        text, tokens = serve_http.chat_text(answer)
        outcome, problem = classify(
            answer.status, text, tokens, r.data.get("baseline_prompt_tokens"), kind in takes
        )
        case = {"case": name, "kind": kind, "status": answer.status, "outcome": outcome}
        if problem:
            case["server_line"] = line = r.server.error_line(since, settle=0.5)
            r.fail("bad media %s: %s%s" % (name, problem, "; server: " + line if line else ""))
        case["recovery"] = recovery = recover(r)
        cases.append(case)
        if recovery != "ok":
            r.fail("after bad media %s the server did not recover: %s" % (name, recovery))
            if not r.server.alive():
                return


def classify(status, text, tokens, baseline, takes_kind: bool) -> tuple:
    """(outcome, problem or None) of one bad-media answer: refused (4xx, expected), ignored (200,
    the prompt counted as the text alone), accepted (200, taken as if it were valid media)."""
    if status is None:
        return "no_answer", "no answer"
    if 400 <= status < 500:
        return "refused", None
    if status >= 500:
        return "server_error", "answered %d (a client error, 4xx, expected)" % status
    if status != 200:
        return "unexpected", "answered %d (4xx expected)" % status
    if not text:
        return "empty", "200 with empty content"
    if tokens is None or baseline is None:
        if takes_kind:
            return "unknown", "200 with text; no prompt token count tells whether the media was taken"
        return "unknown", None
    if tokens == baseline:
        return "ignored", ("200: the media was ignored, for a model that takes it" if takes_kind else None)
    return "accepted", "200: the corrupt media was taken as valid (%s prompt tokens, %s without it)" % (
        tokens,
        baseline,
    )


def recover(r: Run) -> str:
    """'ok', or what is wrong after a bad request: the process, readiness, the next request."""
    path = r.params.get("ready_path", "/health")
    ready = r.get(path, 5.0) if r.server.alive() else None
    if ready is not None and ready.status == 200:
        answer = r.chat(PROMPT, max_tokens=1)
        if answer.status == 200 and serve_http.chat_text(answer)[0] is not None:
            return "ok"
        problem = "the next request: %s" % answer.said()[:200]
    else:
        problem = "%s answered %s" % (path, ready.said()[:200]) if ready is not None else ""
    # A server that is dying may still hold its socket for a moment: its exit is the cause.
    code = exit_code(r.server.proc, 1.0)
    return "the server exited %s" % code if code is not None else problem


def exit_code(proc, grace: float):
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # still running
        return None


def startup_probe(seconds: float, period: int, margin: float) -> dict:
    """A Kubernetes startupProbe that covers the measured start-up with `margin` (0.5: half again)."""
    budget = seconds * (1 + margin)
    threshold = max(1, math.ceil(budget / period))
    return {
        "periodSeconds": period,
        "failureThreshold": threshold,
        "budget_s": period * threshold,
        "measured_s": round(seconds, 3),
        "margin": margin,
    }


def verdict(problems: list, data: dict) -> tuple:
    if problems:
        status = "FAIL" if any(s == "FAIL" for s, _ in problems) else "ERROR"
        return status, "; ".join(text for _, text in problems)
    t = data.get("timeline", {})
    cases = data.get("bad_media") or []
    counts = {}
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    told = ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items())) or "not sent"
    probe = data.get("startup_probe", {})
    checks = ", ".join(c["check"] for c in data.get("functional", []))
    return (
        "PASS",
        "ready %.1fs (listening %.1fs), first token %s; %s; bad media: %s; startupProbe %ds x %d"
        % (
            t.get("ready_s", 0),
            t.get("listen_s", 0),
            "%.1fs" % t["first_token_s"] if "first_token_s" in t else "n/a",
            checks,
            told,
            probe.get("periodSeconds", 0),
            probe.get("failureThreshold", 0),
        ),
    )
