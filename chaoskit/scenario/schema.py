"""The JSON Schema of scenarios, generated from the models (never written by hand)."""

from __future__ import annotations

import json

from chaoskit.scenario.model import scenario_model

__all__ = ["schema_dict", "schema_text"]


def schema_dict() -> dict:
    schema = scenario_model().model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "chaoskit scenario"
    return schema


def schema_text() -> str:
    return json.dumps(schema_dict(), indent=2, sort_keys=True) + "\n"
