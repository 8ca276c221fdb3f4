"""One convolution problem and the three kernels (ops) it gives rise to.

The counterpart of μ-cuDNN's ``convParam``: everything cuDNN needs to
describe the convolution except the data pointers.  ``n`` is the mini-batch
size to plan for; a micro-batch is the same problem with a smaller ``n``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from .errors import InputError

Op = Literal["forward", "backward_data", "backward_filter"]
OPS: tuple[str, ...] = ("forward", "backward_data", "backward_filter")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
LAYOUTS: tuple[str, ...] = ("NCHW", "NHWC")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: (a, b, out) operand roles of each op, in cuDNN's argument order: x input, w filter, y output (or their gradients)
ROLES: dict[str, tuple[str, str, str]] = {"forward": ("x", "w", "y"), "backward_data": ("w", "y", "x"),
                                          "backward_filter": ("x", "y", "w")}


def _pair(value: Any, field: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return (int(value[0]), int(value[1]))
    raise InputError(f"expected an integer or a pair of integers, got {value!r}", field)


@dataclass(frozen=True)
class ConvProblem:
    """A 2-D convolution (cross-correlation, as in every framework).

    x: (n, c, h, w) in ``layout``; w: (k, c/groups, r, s); y: (n, k, p, q).

    ``k_total``: set on a *channel slice* (issue 18): this problem computes ``k`` of the ``k_total`` output
    channels of a wider convolution, so y (dy) keeps the wider tensor's strides (a view, no copy) while w (dw)
    is the contiguous block of its ``k`` filters.  None: y is packed (every whole problem).  Only runtime
    sub-problems carry it; tables and plans record the slice as a measurement's ``channels``.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype: str = "float32"
    layout: str = "NCHW"
    k_total: int | None = None

    def __hash__(self) -> int:
        """The fields' hash, computed once per object.

        Why cached: problems key every cache on the launch path (prepared calls, executors, descriptors), and
        the generated hash rebuilt a 14-field tuple on every lookup, several per launch of a training step.
        Not pickled (:meth:`__getstate__`): strings hash differently in another process.
        """
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = hash((self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.pad, self.stride, self.dilation,
                      self.groups, self.dtype, self.layout, self.k_total))
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s", "groups"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"must be a positive integer, got {v!r}", f"problem.{name}")
            if v > 1 << 31:
                raise InputError(f"is too large ({v})", f"problem.{name}")
        object.__setattr__(self, "pad", _pair(self.pad, "problem.pad"))
        object.__setattr__(self, "stride", _pair(self.stride, "problem.stride"))
        object.__setattr__(self, "dilation", _pair(self.dilation, "problem.dilation"))
        if min(self.pad) < 0:
            raise InputError("must not be negative", "problem.pad")
        if min(self.stride) < 1:
            raise InputError("must be positive", "problem.stride")
        if min(self.dilation) < 1:
            raise InputError("must be positive", "problem.dilation")
        if self.dtype not in DTYPES:
            raise InputError(f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}", "problem.dtype")
        if self.layout not in LAYOUTS:
            raise InputError(f"must be one of {', '.join(LAYOUTS)}, got {self.layout!r}", "problem.layout")
        if self.c % self.groups or self.k % self.groups:
            raise InputError(f"groups={self.groups} must divide c={self.c} and k={self.k}", "problem.groups")
        if self.k_total is not None:
            if not isinstance(self.k_total, int) or isinstance(self.k_total, bool) or self.k_total < self.k:
                raise InputError(f"must be an integer >= k={self.k}, got {self.k_total!r}", "problem.k_total")
            if self.groups != 1:
                raise InputError("channel slices need groups == 1", "problem.k_total")
        if self.p < 1 or self.q < 1:
            raise InputError(
                f"the filter ({self.r}x{self.s}, dilation {self.dilation}) does not fit the padded input "
                f"({self.h}x{self.w}, pad {self.pad})", "problem")

    # Output spatial size (cudnnGetConvolution2dForwardOutputDim's formula).
    @property
    def p(self) -> int:
        return (self.h + 2 * self.pad[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.pad[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    def with_batch(self, n: int) -> "ConvProblem":
        """The same convolution at micro-batch size ``n``."""
        return dataclasses.replace(self, n=n)

    def with_channels(self, k: int, k_total: int | None = None) -> "ConvProblem":
        """``k`` of this problem's output channels as a slice of its y (``k_total``: default this problem's k)."""
        return dataclasses.replace(self, k=k, k_total=self.k if k_total is None else k_total)

    def x_strides(self) -> tuple[int, int, int, int]:
        """Element strides of a packed x in (n, c, h, w) order, in the problem's layout."""
        c, h, w = self.c, self.h, self.w
        return (c * h * w, h * w, w, 1) if self.layout == "NCHW" else (h * w * c, 1, w * c, c)

    def w_strides(self) -> tuple[int, int, int, int]:
        """Element strides of a packed filter in (k, c, r, s) order: [K][C/G][R][S] for NCHW, [K][R][S][C/G] for
        NHWC."""
        cg, r, s = self.c // self.groups, self.r, self.s
        return (cg * r * s, r * s, s, 1) if self.layout == "NCHW" else (r * s * cg, 1, s * cg, cg)

    def y_strides(self) -> tuple[int, int, int, int]:
        """Element strides of y (dy) in (n, k, p, q) order: packed, or a channel slice's view of the wider y."""
        kt = self.k if self.k_total is None else self.k_total
        pq = self.p * self.q
        if self.layout == "NCHW":
            return (kt * pq, pq, self.q, 1)
        return (pq * kt, 1, self.q * kt, kt)

    def x_shape(self, n: int | None = None) -> tuple[int, int, int, int]:
        n = self.n if n is None else n
        return (n, self.c, self.h, self.w) if self.layout == "NCHW" else (n, self.h, self.w, self.c)

    def y_shape(self, n: int | None = None) -> tuple[int, int, int, int]:
        n = self.n if n is None else n
        return (n, self.k, self.p, self.q) if self.layout == "NCHW" else (n, self.p, self.q, self.k)

    def w_shape(self) -> tuple[int, int, int, int]:
        cg = self.c // self.groups
        return (self.k, cg, self.r, self.s) if self.layout == "NCHW" else (self.k, self.r, self.s, cg)

    def shape(self, role: str) -> tuple[int, int, int, int]:
        """The shape of operand ``role`` (``x``, ``w`` or ``y``) in this problem's layout."""
        return {"x": self.x_shape, "w": self.w_shape, "y": self.y_shape}[role]()

    def operand_shapes(self, op: str) -> tuple[tuple[int, int, int, int], ...]:
        """Shapes of ``op``'s (a, b, out) operands, in cuDNN's order (see ROLES)."""
        return tuple(self.shape(r) for r in ROLES[op])

    def flops(self, n: int | None = None) -> int:
        """Multiply-adds x 2 of one op (all three ops do the same arithmetic)."""
        n = self.n if n is None else n
        return 2 * n * self.k * self.p * self.q * (self.c // self.groups) * self.r * self.s

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["k_total"] is None:
            del d["k_total"]   # whole problems keep the dict (and key) they always had
        d["pad"], d["stride"], d["dilation"] = list(self.pad), list(self.stride), list(self.dilation)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], field: str = "problem") -> "ConvProblem":
        if not isinstance(d, dict):
            raise InputError(f"expected an object, got {type(d).__name__}", field)
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [k for k in ("n", "c", "h", "w", "k", "r", "s") if k not in d]
        if missing:
            raise InputError(f"missing {', '.join(missing)}", field)
        kwargs = {k: v for k, v in d.items() if k in names}
        for key in ("pad", "stride", "dilation"):
            if key in kwargs and isinstance(kwargs[key], list):
                kwargs[key] = tuple(kwargs[key])
        try:
            return cls(**kwargs)
        except InputError as e:
            # re-anchor the field path under the caller's prefix
            sub = (e.field or "problem").removeprefix("problem")
            raise InputError(str(e).split(": ", 1)[-1], field + sub) from None

    def key(self, include_n: bool = True) -> str:
        """Stable short hash; equal problems share benchmarks (ResNet repeats layers)."""
        d = self.to_dict()
        if not include_n:
            d.pop("n")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        g = f" g{self.groups}" if self.groups > 1 else ""
        return (f"n{self.n} c{self.c} {self.h}x{self.w} -> k{self.k} {self.r}x{self.s} "
                f"pad{list(self.pad)} stride{list(self.stride)} dil{list(self.dilation)}{g} {self.dtype} {self.layout}")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel: a named (problem, op).  A conv layer gives three (forward, backward_data, backward_filter)."""

    name: str
    op: str
    problem: ConvProblem
