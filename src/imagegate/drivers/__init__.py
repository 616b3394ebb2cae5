"""Drivers: where a bundle runs (docker/podman container, an unpacked root under bubblewrap,
this environment); `select` picks one from the command line's --driver."""

from imagegate.drivers.interface import BundleRun, Driver

__all__ = ["BundleRun", "Driver"]
