"""imagegate: accept or reject a container image before it reaches GPUs."""

__version__ = "0.1.0"
