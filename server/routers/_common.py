"""Pieces every router shares: the error responses the OpenAPI document lists."""
from __future__ import annotations

from typing import Any

from ..models import ErrorBody


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these status codes, all with the ErrorBody shape."""
    text = {401: "missing or wrong bearer token", 404: "unknown id", 409: "no plan fits the budget; the body names "
            "the smallest budget that works", 413: "request body too large", 422: "invalid input; `field` names it",
            503: "this host cannot do it (no GPU)"}
    return {c: {"model": ErrorBody, "description": text[c]} for c in codes}
