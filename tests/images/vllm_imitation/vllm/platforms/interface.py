class Platform:
    device_type = ""


class UnspecifiedPlatform(Platform):
    device_type = ""


class CudaPlatform(Platform):
    device_type = "cuda"
