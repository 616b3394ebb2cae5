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
    # SGLang (0.5.23, read in sglang/cli/serve.py, launch_server.py, srt/server_args.py): both
    # `sglang serve` (its llm backend) and `python -m sglang.launch_server` look up
    # srt.server_args.prepare_server_args when they run, parse with argparse there (a bad flag
    # exits 2 with its message), then start the server; wrapping it ends the process after the
    # parse. ServerArgs.__post_init__ checks nothing in this release: resolve_once() does, and it
    # reads the model's config and the device past the checks that need neither, where a
    # model_path of "dummy" stops it. Any other backend (diffusion, a plugin's) is refused, not
    # started (ERROR: not checked); HF_HUB_OFFLINE keeps the backend detection from asking the hub
    # about a model id. The lines written are the ones serve.parse_verdict reads.
    "sglang": {
        "platform": "sglang-cpu",
        "code": (
            "import os as _o, sys as _s, dataclasses as _d\n"
            "_o.environ.setdefault('HF_HUB_OFFLINE', '1')\n"
            "import sglang.srt.server_args as _a\n"
            "_prepare = _a.prepare_server_args\n"
            "def _parsed(argv):\n"
            "    args = _prepare(argv)\n"
            "    model = args.model_path\n"
            "    if hasattr(args, 'resolve_once'):\n"
            "        args.model_path = 'dummy'\n"
            "        args.resolve_once()\n"
            "    from sglang.srt.platforms import current_platform as _p\n"
            "    _s.stderr.write('imagegate: parsed, not started: model=%s platform=%s"
            " (the checks that read no model ran)\\n' % (model, type(_p).__name__))\n"
            "    _s.exit(0)\n"
            "_a.prepare_server_args = _parsed\n"
            "try:\n"
            "    import sglang.cli.serve_backends as _b\n"
            "except ImportError:\n"
            "    _b = None\n"
            "def _llm_only(self, name, _get=_b and _b.ServeBackendRegistry.get):\n"
            "    r = _get(self, name)\n"
            "    if r.name == 'llm':\n"
            "        return r\n"
            "    def _refuse(request):\n"
            "        _s.stderr.write('imagegate: not parsed: backend %s was selected, parse_only sglang"
            " parses the llm server only; nothing was started\\n' % r.name)\n"
            "        _s.exit(3)\n"
            "    return _d.replace(r, backend=_d.replace(r.backend, run=_refuse))\n"
            "if _b is not None:\n"
            "    _b.ServeBackendRegistry.get = _llm_only\n"
        ),
    },
}
