"""Numerics modes: which math a measurement may use.  Part of every cache key.

* ``strict`` — true FP32 arithmetic (cuDNN ``FMA`` math) for float32; no TF32.
* ``tf32`` — float32 may use TF32 tensor cores (cuDNN ``DEFAULT`` / ``TENSOR_OP`` math).
* ``default`` — whatever cuDNN offers for the dtype (float16 / bfloat16 use tensor cores).

A ``-deterministic`` suffix (``strict-deterministic``) also drops
algorithms cuDNN reports as non-deterministic.  Measurements of different
modes are never mixed: a table records its mode, plans inherit it.
"""
from __future__ import annotations

from .errors import InputError

MODES = ("strict", "tf32", "default")


def normalize(numerics: str | None, dtype: str = "float32") -> str:
    """Validate; ``None`` picks ``strict`` for float32 and ``default`` otherwise."""
    if numerics is None:
        return "strict" if dtype == "float32" else "default"
    base, _, det = numerics.partition("-")
    if base not in MODES or det not in ("", "deterministic"):
        raise InputError(f"unknown numerics {numerics!r}; use one of {', '.join(MODES)} "
                         "optionally with '-deterministic'", "numerics")
    return numerics


def deterministic_only(numerics: str) -> bool:
    return numerics.endswith("-deterministic")


def descriptor_math_type(numerics: str, dtype: str) -> str:
    """Math type to set on the convolution descriptor before Find."""
    return "FMA" if numerics.startswith("strict") and dtype == "float32" else "DEFAULT"


def allowed_math_types(numerics: str, dtype: str) -> frozenset[str]:
    base = numerics.partition("-")[0]
    if dtype == "float32":
        if base == "strict":
            return frozenset({"FMA"})
        if base == "tf32":
            return frozenset({"FMA", "DEFAULT", "TENSOR_OP"})
        return frozenset({"FMA", "DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION"})
    # half precision: down-conversion is meaningless, tensor cores are the point
    return frozenset({"FMA", "DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION"})
