"""The published JSON Schema of results.json, generated from the pydantic models in results.py.

Other tools validate against the checked-in matrix/results.schema.json (shipped in the
wheel); a test fails while it differs from the models. After changing the models:

    python -m matrix.results_schema
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic.json_schema import GenerateJsonSchema

from .results import SCHEMA_VERSION, RunResults

SCHEMA_FILE = Path(__file__).with_name("results.schema.json")
NON_FINITE = ["Infinity", "-Infinity", "NaN"]


class _NonFiniteAsStrings(GenerateJsonSchema):
    """A float may be written as "Infinity", "-Infinity" or "NaN" (see results.Record)."""

    def float_schema(self, schema):
        return {"anyOf": [super().float_schema(schema), {"enum": NON_FINITE}]}


def generate() -> dict:
    body = RunResults.model_json_schema(schema_generator=_NonFiniteAsStrings)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"policy-matrix results.json, schema_version {SCHEMA_VERSION}", **{k: v for k, v in body.items() if k != "title"}}


def text() -> str:
    return json.dumps(generate(), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(text())
    print(SCHEMA_FILE)
