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
    },
}
