"""Byte sizes as users write them: ``64MiB``, ``1.5GB``, ``4096``.

Binary (KiB/MiB/GiB/TiB) and decimal (KB/MB/GB/TB) suffixes are both
accepted, case-insensitively; a bare number is bytes.  Sizes larger than
``MAX_BYTES`` are refused: nobody has 1 EiB of workspace, and such numbers
usually mean a unit mistake.
"""
from __future__ import annotations

import math
import re

from .errors import InputError

MAX_BYTES = 1 << 60  # 1 EiB

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_RE = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]*)?|-?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")


def parse_size(value: str | int | float, field: str = "size", allow_zero: bool = True) -> int:
    """Return ``value`` in bytes; raise :class:`InputError` naming ``field`` if it is not a size."""
    if isinstance(value, bool):
        raise InputError(f"expected a size such as '64MiB', got {value!r}", field)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"expected a finite size, got {value!r}", field)
        nbytes = value
    elif isinstance(value, str):
        m = _RE.match(value)
        if not m:
            raise InputError(f"expected a size such as '64MiB', '512MB' or '4096', got {value!r}", field)
        mant, exp, suffix = m.groups()
        unit = _UNITS.get(suffix.lower())
        if unit is None:
            raise InputError(f"unknown unit {suffix!r} in {value!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", field)
        number = float(mant) * (10 ** int(exp) if exp else 1)
        nbytes = number * unit
    else:
        raise InputError(f"expected a size such as '64MiB', got {type(value).__name__}", field)
    if nbytes < 0:
        raise InputError(f"size must not be negative, got {value!r}", field)
    if nbytes > MAX_BYTES:
        raise InputError(f"size {value!r} is larger than {format_size(MAX_BYTES)}", field)
    result = int(round(nbytes))
    if result == 0 and not allow_zero:
        raise InputError(f"size must be positive, got {value!r}", field)
    return result


def format_size(nbytes: int) -> str:
    """Human-readable binary size: ``format_size(67108864) == '64 MiB'``."""
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
