"""Drivers: where a bundle runs (docker/podman container, this environment)."""

from imagegate.drivers.interface import BundleRun, Driver

__all__ = ["BundleRun", "Driver"]
