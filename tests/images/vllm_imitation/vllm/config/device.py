class DeviceConfig:
    def __init__(self, device="auto"):
        self.device = device
        self.__post_init__()

    def __post_init__(self):
        if self.device == "auto":
            from vllm.platforms import current_platform

            self.device_type = current_platform.device_type
            if not self.device_type:
                raise RuntimeError("Failed to infer device type")
