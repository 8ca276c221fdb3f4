"""Numerics modes: which math a measurement may use.  Part of every cache key.

* ``strict`` — true FP32 arithmetic (cuDNN ``FMA`` math) for float32; no TF32.
* ``tf32`` — float32 may use TF32 tensor cores (cuDNN ``DEFAULT`` / ``TENSOR_OP`` math).
* ``default`` — whatever cuDNN offers for the dtype, down-conversion included.

For float16 / bfloat16 data ``strict`` and ``tf32`` mean float32 accumulation
(DEFAULT / TENSOR_OP / FMA math, no ``TENSOR_OP_ALLOW_CONVERSION``).

A ``-deterministic`` suffix (``strict-deterministic``) also drops
algorithms cuDNN reports as non-deterministic.  Measurements of different
modes are never mixed: a table records its mode, plans inherit it.
"""
from __future__ import annotations

from typing import Iterable

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


def allowed_math_types(numerics: str, dtype: str) -> tuple[str, ...]:
    """cuDNN math types a measurement may use, in the order Find is run under them.

    cuDNN 9's legacy Find only returns an algorithm's tensor-op variant when the
    descriptor's math type asks for it (measured on an H100, cuDNN 9.19: float16
    NHWC backward-data algo 1 takes 11 ms under DEFAULT, 0.7 ms under TENSOR_OP),
    so Find runs once per allowed math type and the rows are united.
    """
    base = numerics.partition("-")[0]
    if dtype == "float32":
        return {"strict": ("FMA",), "tf32": ("FMA", "DEFAULT", "TENSOR_OP"),
                "default": ("FMA", "DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION")}[base]
    # float16 / bfloat16 data, float32 accumulation: "strict" keeps it that way, "default" lets cuDNN down-convert
    if base == "default":
        return ("DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION")
    return ("DEFAULT", "TENSOR_OP", "FMA")


def find_math_types(numerics: str, dtype: str) -> tuple[str, ...]:
    """The math types legacy Find must run under to return every configuration :func:`allowed_math_types` allows.

    Measured on an H100 (cuDNN 9.19, AlexNet b256 FP16 NHWC, every kernel at every power-of-two micro-batch,
    ``benchmarks/results/find_probe.md``): Find under TENSOR_OP returns each algorithm's DEFAULT row as well
    (the same 270 rows Find under DEFAULT returns), and for 16-bit data TENSOR_OP_ALLOW_CONVERSION returns the
    same algorithms with the same workspace as TENSOR_OP (there is nothing to convert: the data is already
    16-bit), at equal times within Find's noise.  Each Find took about 6 s there, so for 16-bit data Find runs
    once, under TENSOR_OP, where it ran three times.  FP32 data keeps one Find per math type: not measured to
    be redundant (FP32 strict has one math type anyway).
    """
    allowed = allowed_math_types(numerics, dtype)
    if dtype == "float32" or "TENSOR_OP" not in allowed:
        return allowed
    return tuple(m for m in allowed if m not in ("DEFAULT", "TENSOR_OP_ALLOW_CONVERSION"))


def inferred(dtype: str, math_types: Iterable[str]) -> str | None:
    """The numerics that measurements of ``dtype`` data under ``math_types`` are taken to have (a table without
    a ``numerics`` field, :func:`ucudnn.planning.table.effective_numerics`).

    The dtype's default (:func:`normalize` of None: ``strict`` for float32, ``default`` otherwise) when it allows
    every one of the math types, else the narrowest mode that does, in the order strict, tf32, default (a mode
    allows its own math types and every stricter mode's): an FP32 table with TENSOR_OP rows is ``tf32``, never
    labelled ``strict``.  None when no mode allows them all (a math type cuDNN does not have).  Never
    ``-deterministic``: math types do not say whether an algorithm is.
    """
    seen = set(math_types)
    start = MODES.index(normalize(None, dtype))
    allowed: set[str] = set()
    for i, mode in enumerate(MODES):
        allowed.update(allowed_math_types(mode, dtype))
        if i >= start and seen <= allowed:
            return mode
    return None
