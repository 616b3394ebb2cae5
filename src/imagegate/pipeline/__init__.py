"""Pipelines: load, validate, plan."""

from imagegate.pipeline.load import LoadedPipeline, builtin_names, load, parse
from imagegate.pipeline.spec import Pipeline

__all__ = ["LoadedPipeline", "Pipeline", "builtin_names", "load", "parse"]
