from vllm.platforms.interface import Platform


class CpuPlatform(Platform):
    device_type = "cpu"
