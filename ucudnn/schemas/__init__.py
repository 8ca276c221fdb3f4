"""JSON Schemas of ucudnn's interchange formats, one file per format."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import InputError

FORMATS = {
    "ucudnn-benchmark-table/1": "benchmark-table.schema.json",
    "ucudnn-plan/1": "plan.schema.json",
    "ucudnn-network/1": "network.schema.json",
    "ucudnn-inference-plan/1": "inference-plan.schema.json",
}


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """The schema for a format name (``ucudnn-plan/1``) or a schema file name."""
    fname = FORMATS.get(name, name)
    return json.loads(resources.files(__package__).joinpath(fname).read_text())


def validate(doc: Any, name: str, error: type[InputError] = InputError) -> None:
    """Raise ``error`` naming the first offending field (e.g. ``kernels[0].problem.n``); where the field must match
    one of several forms, the error inside the form that fits it best (jsonschema's ``best_match``)."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(load_schema(name))
    validator = validator_cls(load_schema(name))
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        if e.context:       # a oneOf / anyOf: say what is wrong in the alternative the document meant
            e = jsonschema.exceptions.best_match([e])
        path = ""
        for part in e.absolute_path:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        raise error(e.message, path or "(document)")
