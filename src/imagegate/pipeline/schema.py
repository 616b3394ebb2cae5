"""The JSON Schema of the pipeline file, generated from the model (manifests/ holds a copy that
a test keeps in step)."""

from __future__ import annotations

import json

from imagegate._support.jsontypes import JsonObject
from imagegate.pipeline.spec import Pipeline

SCHEMA_ID = "https://imagegate.dev/schemas/pipeline-v1.schema.json"


def pipeline_schema() -> JsonObject:
    schema = Pipeline.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def pipeline_schema_text() -> str:
    return json.dumps(pipeline_schema(), indent=2, sort_keys=True) + "\n"
