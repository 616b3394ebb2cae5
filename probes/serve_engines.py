"""The serve probe's built-in engines: the start-up phases each server logs, as regular
expressions, with the installed distribution whose code logs them. A pipeline names one as
`engine:`; its own `phases:` add to or replace these.

This table is the one source: the runner validates `engine:` against its keys by reading this
file (imagegate/pipeline/params.py parses it; it never imports the probes), so ENGINES must stay
a literal. tests/real checks every pattern against the code of the installed releases the
repository builds (vLLM 0.33.0, SGLang 0.5.23): each regex must match a line of that package's
source, so a renamed log message fails CI instead of silently dropping a phase.
"""

ENGINES = {
    "vllm": {
        "weights_loaded": ["vllm", r"Loading weights took "],
        "model_loaded": ["vllm", r"Model loading took "],
        "kv_cache": ["vllm", r"Available KV cache memory: "],
        "graph_capture": ["vllm", r"Graph capturing finished in "],
        "engine_ready": ["vllm", r"init engine \(profile, create kv cache, warmup model\) took "],
        "ready": ["uvicorn", r"Application startup complete"],
    },
    "sglang": {
        "weights_loaded": ["sglang", r"Load weight end\. "],
        "kv_cache": ["sglang", r"Memory pool end\. "],
        "graph_capture": ["sglang", r"Capture [^\n]{1,60}? end\. "],
        "ready": ["sglang", r"The server is fired up and ready to roll!"],
    },
    "transformers": {
        "weights_loaded": ["transformers", r"Loading weights"],
        "ready": ["uvicorn", r"Application startup complete"],
        # uvicorn says so once its socket is bound: the first moment a request can be answered
        "listening": ["uvicorn", r"Uvicorn running on"],
        # uvicorn's access log of the first 200 to the readiness path (the stage's own poll)
        "first_200": ["uvicorn", r"\"GET /health HTTP/1\.1\" 200"],
    },
}

# Parse-only checks of a server's assembled argv on a host without a GPU (`parse_only: NAME`):
# a platform override of probes/platforms.py, then code run before the CLI builds its parser
# that swaps the server's start for a report of the parsed arguments. vLLM (0.33.0, read in
# vllm/entrypoints/cli/main.py): main() binds `dispatch_function=cmd.cmd` while it builds the
# parser, parses, calls ServeSubcommand.validate, then dispatches; replacing the static method
# `cmd` before main() runs leaves parsing and validation as they are and starts nothing.
PARSE_ONLY = {
    "vllm": {
        "platform": "vllm-cpu",
        "code": (
            "import sys as _s\n"
            "import vllm.entrypoints.cli.serve as _v\n"
            "def _parsed(args):\n"
            "    _s.stderr.write('imagegate: parsed, not started: model=%s\\n' % getattr(args, 'model_tag', None))\n"
            "    _s.exit(0)\n"
            "_v.ServeSubcommand.cmd = staticmethod(_parsed)\n"
        ),
    },
}
