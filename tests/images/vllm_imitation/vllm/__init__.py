"""Imitation of vLLM for imagegate's tests (not vLLM)."""

__version__ = "0.11.0"
