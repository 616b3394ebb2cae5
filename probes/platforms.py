"""The built-in platform overrides of the `cli` probe: Python code run in the CLI's process
before it builds its parser, so that a CLI that infers its device at parse time (vLLM) can be
checked on a host without a GPU. A pipeline names one as `platform:`.

This table is the one source: the runner validates `platform:` against its keys by reading this
file (imagegate/pipeline/params.py parses it; it never imports the probes), so OVERRIDES must stay
a literal dict of string to string.
"""

# Run on real vLLM 0.10.2, 0.11.0, 0.33.0 (the dated records in
# benchmarks/records, scripts/real-frameworks.py): vllm.platforms resolves _current_platform
# lazily on first access to current_platform; it must be set before vllm.engine.arg_utils is
# imported.
OVERRIDES = {
    "vllm-cpu": (
        "import sys as _s\n"
        "import vllm.platforms as _p\n"
        "from vllm.platforms.cpu import CpuPlatform as _C\n"
        "_p._current_platform = _C()\n"
        # A release that binds current_platform at import time (none of those run) gets it too.
        "if 'current_platform' in vars(_p): _p.current_platform = _p._current_platform\n"
        "_s.stderr.write('imagegate: platform override vllm-cpu applied: current_platform=%s\\n'"
        " % type(_p._current_platform).__name__)\n"
        "_s.stderr.flush()\n"
    ),
    # Run on real SGLang 0.5.23 (tests/real/test_serve_builtins.py): sglang.srt.platforms picks
    # CpuSRTPlatform when SGLANG_USE_CPU_ENGINE=1, ahead of CUDA, and utils.common.is_cpu() reads
    # the same variable; both are read at first use, so setting it before sglang is imported is
    # enough. No visible CUDA device keeps torch from touching a GPU the host may have.
    "sglang-cpu": (
        "import os as _o, sys as _s\n"
        "_o.environ['SGLANG_USE_CPU_ENGINE'] = '1'\n"
        "_o.environ['CUDA_VISIBLE_DEVICES'] = ''\n"
        "_s.stderr.write('imagegate: platform override sglang-cpu applied: SGLANG_USE_CPU_ENGINE=1,"
        " no CUDA device visible\\n')\n"
        "_s.stderr.flush()\n"
    ),
}
