import os

from vllm.platforms.interface import CudaPlatform, UnspecifiedPlatform

_current_platform = None


def _detect():
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if os.path.exists("/dev/nvidia0") and visible not in ("void", "none"):
        return CudaPlatform()
    return UnspecifiedPlatform()


def __getattr__(name):
    # Like vLLM: current_platform is resolved lazily on first access.
    global _current_platform
    if name == "current_platform":
        if _current_platform is None:
            _current_platform = _detect()
        return _current_platform
    raise AttributeError(name)
