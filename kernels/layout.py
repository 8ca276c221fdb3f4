"""Layout transformation between NCHW, CHWN and NHWC (any pair) on CuPy arrays.

    y = transform_layout(x, src="NCHW", dst="CHWN")

``x`` has the shape of its layout (NCHW: ``(N, C, H, W)``, CHWN: ``(C, H, W, N)``,
NHWC: ``(N, H, W, C)``); the result has the shape of ``dst``.  Any dtype of 1, 2,
4 or 8 bytes works: the kernel moves bits.

How (seed 000, IV.C): H and W are adjacent in every layout, so they merge
into one spatial dimension S and each pair becomes one transpose
``x[P][A][M][D] -> y[P][D][M][A]`` (:func:`reduce_pair`), run by one tiled
kernel (``layout.cu``).  :func:`plan_transpose` (pure Python, no GPU) picks
the tile, the vector widths and the bank-conflict padding; it is what the CPU
tests check.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Any, Callable

from ucudnn.errors import InputError

from . import _compile

LAYOUTS = ("NCHW", "CHWN", "NHWC")
SOURCE = "layout.cu"
SMALL = 32  # a dimension under a warp's width is taken whole into a tile
SMEM_LIMIT = 48 * 1024  # static shared memory per block
_UINT = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


@dataclass(frozen=True)
class Transpose:
    """``x[P][A][M][D] -> y[P][D][M][A]``: the one operation every layout pair reduces to."""

    p: int
    a: int
    m: int
    d: int


def _merged(layout: str) -> str:
    return layout.replace("HW", "S")


def reduce_pair(src: str, dst: str, shape: tuple[int, ...]) -> Transpose | None:
    """The transpose that turns ``src`` (with ``shape``) into ``dst``; ``None`` when they are the same layout."""
    _check_layout(src, "src")
    _check_layout(dst, "dst")
    if src == dst:
        return None
    size = dict(zip(src, shape))
    size["S"] = size["H"] * size["W"]
    s, t = _merged(src), _merged(dst)
    n = len(s)
    for i in range(n):
        for j in range(i + 1, n + 1):
            for k in range(j, n):
                pp, a, m, d = s[:i], s[i:j], s[j:k], s[k:]
                if pp + d + m + a == t:
                    return Transpose(*(prod(size[c] for c in part) for part in (pp, a, m, d)))
    raise AssertionError(f"no transpose form for {src}->{dst}")  # unreachable for the three layouts


def _check_layout(layout: str, field: str) -> None:
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}", field)


@dataclass(frozen=True)
class TilePlan:
    """One launch of ``layout_transpose``: tile TA x TM x TD, vector widths, padded row SD, threads NT.

    ``fi`` / ``fo``: the loads / stores run their vectors along the tile's flattened order
    (the small dimension taken whole makes it contiguous), not along d / a alone.
    """

    ta: int
    tm: int
    td: int
    vi: int
    vo: int
    sd: int
    nt: int
    tiles_a: int
    tiles_m: int
    tiles_d: int
    grid: int
    fi: bool = False
    fo: bool = False
    # "rows": layout_rows_aligned (tm == 1; y's rows cut at aligned flat offsets, x's rows staged);
    # "shifted": layout_rows_shifted (the same cut, y's pieces staged; sd = their row length SA, gv = vectors
    # per staged row in one warp load, bulk: pieces leave through the bulk copy engine, async_loads: x's elements
    # go straight into their staged place as 4-byte cp.async copies, not through registers)
    kind: str = "tile"
    gv: int = 1
    bulk: bool = False
    async_loads: bool = False

    def name_expr(self, itemsize: int) -> str:
        t = _UINT[itemsize]
        if self.kind == "rows":
            return f"layout_rows_aligned<{t},{self.ta},{self.td},{self.vi},{self.vo},{self.sd},{self.nt}>"
        if self.kind == "shifted":
            bulk = "true" if self.bulk else "false"
            tail = ",true" if self.async_loads else ""
            return (f"layout_rows_shifted<{t},{self.ta},{self.td},{self.vi},{self.vo},{self.sd},{self.gv},{self.nt},"
                    f"{bulk}{tail}>")
        flags = f"{'true' if self.fi else 'false'},{'true' if self.fo else 'false'}"
        return f"layout_transpose<{t},{self.ta},{self.tm},{self.td},{self.vi},{self.vo},{self.sd},{self.nt},{flags}>"


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def _pow2_ceil(v: int) -> int:
    return 1 << (max(1, v) - 1).bit_length()


def _vector(extent: int, tile: int, itemsize: int, ptr_align: int) -> int:
    """Widest vector (<= 16 bytes) that divides the dimension and the tile and keeps every access aligned."""
    v = 16 // itemsize
    while v > 1 and (extent % v or tile % v or ptr_align % (v * itemsize)):
        v //= 2
    return max(v, 1)


def _flat_vector(outer: int, small: int, m: int, tile_outer: int, tm: int, itemsize: int, ptr_align: int) -> int:
    """Widest vector along a tile side whose small dimension (``small``) is taken whole.

    That side's rows ``(m, small)`` are contiguous, and all of the tile when it
    spans every ``m`` (``tm == m``).  A vector must start aligned and must not
    cross a jump in addresses: the strides it may straddle (``tm * small`` per
    row, ``m * small`` per outer index) must be multiples of it.
    """
    v = 16 // itemsize
    while v > 1:
        steps = (outer * m * small, tile_outer * m * small) if tm == m else (m * small, tm * small)
        if ptr_align % (v * itemsize) == 0 and all(st % v == 0 for st in steps):
            break
        v //= 2
    return v


def _wavefronts(elements: list[list[int]], itemsize: int) -> int:
    """Shared-memory wavefronts of one warp access: ``elements[lane][k]`` is lane's k-th element offset.

    Per vector element k, the largest number of distinct 4-byte words the lanes hit in one bank.
    """
    total = 0
    for per_lane in zip(*elements):
        banks: dict[int, set[int]] = {}
        for off in per_lane:
            word = off * itemsize // 4
            banks.setdefault(word % 32, set()).add(word)
        total += max(len(w) for w in banks.values())
    return total


def bank_conflicts(ta: int, tm: int, td: int, vi: int, vo: int, sd: int, itemsize: int) -> int:
    """Shared-memory wavefronts one warp needs for its first read and write of a tile (32 = conflict-free).

    Counts, per element of a vector, the largest number of distinct 4-byte words
    that the warp's lanes hit in one bank, for the store (x's order) and the
    load (y's order) phase.
    """
    tile = ta * tm * td
    ins, outs = [], []
    for lane in range(32):
        if lane * vi + vi <= tile:
            fs = [lane * vi + k for k in range(vi)]
            ins.append([((f // (tm * td)) * tm + (f // td) % tm) * sd + f % td for f in fs])
        if lane * vo + vo <= tile:
            fs = [lane * vo + k for k in range(vo)]
            outs.append([((f % ta) * tm + (f // ta) % tm) * sd + f // (tm * ta) for f in fs])
    return _wavefronts(ins, itemsize) + _wavefronts(outs, itemsize)


def _balanced(extent: int, target: int, quantum: int = 8) -> int:
    """A tile length in [3/4 target, target] (a multiple of ``quantum``) wasting least of ``extent``'s last tile.

    96 -> 48 (two full tiles, not a full and a half-empty one of 64), 784 -> 56; ties go to the longer tile.
    Extents of 64 tiles or more keep ``target`` (290400 -> 64, not 48: measured 92% vs 90% of copy).
    """
    if extent <= target:
        return -(-extent // quantum) * quantum
    if extent >= 64 * target:  # the last tile's waste is negligible: keep the full length (wider rows)
        return target
    sizes = range(target, max(quantum, target * 3 // 4) - 1, -quantum)
    return min(sizes, key=lambda t: (-(-extent // t) * t - extent, -t))


def _rows(m: int, budget: int) -> int:
    """Tile extent along the middle dimension: as many as ``budget`` allows, a multiple of 8 (vector runs)."""
    tm = max(1, min(m, budget))
    return tm if tm == m or tm < 8 else tm // 8 * 8


def _tile(t: Transpose, itemsize: int) -> tuple[int, int, int]:
    elems = min(8192, max(1024, 16384 // itemsize))  # 16 KiB of 4-byte data, 8192 half-precision elements
    if t.a >= SMALL and t.d >= SMALL:
        # float32: 128 along a (512-byte output rows; measured on the H100 +0.5-3% over 64, never worse);
        # a tile smaller than the element budget takes several m (fp16 NHWC -> CHWN: 64x2x64, 90% -> 91%).
        ta = _balanced(t.a, 128 if itemsize == 4 else 64)
        td = _balanced(t.d, elems // 64)
        return ta, _rows(t.m, max(1, elems // (ta * td))), td
    if t.a < SMALL and t.d >= SMALL:  # small A (C=3): taken whole; output rows contiguous over (m, a)
        if t.m == 1:
            return t.a, 1, max(SMALL, min(_pow2_floor(elems // t.a), _pow2_ceil(t.d)))
        td = _balanced(t.d, 64)
        return t.a, _rows(t.m, elems // (t.a * td)), td
    if t.d < SMALL and t.a >= SMALL:  # small D: input rows contiguous over (m, d)
        if t.m == 1:
            return max(SMALL, min(_pow2_floor(elems // t.d), _pow2_ceil(t.a))), 1, t.d
        ta = _balanced(t.a, 64)
        return ta, _rows(t.m, elems // (ta * t.d)), t.d
    return t.a, _rows(t.m, elems // (t.a * t.d)), t.d


# "bulk": "shifted" storing through the copy engine (sm_90); "async": "bulk" whose loads are cp.async copies
# (4-byte elements, TD 32 or 64)
KERNELS = ("tile", "rows", "shifted", "bulk", "async")


def rows_bank_conflicts(ta: int, td: int, vi: int, vo: int, sd: int, itemsize: int) -> int:
    """Shared-memory wavefronts of one warp's first staging store and first gather in ``layout_rows_aligned``."""
    ndv = td // vi
    ins = [[(v // ndv) * sd + (v % ndv) * vi + k for k in range(vi)] for v in range(32)]
    outs = [[((v % 8) * vo + e) * sd + (v // 8) % td for e in range(vo)] for v in range(32)]
    return _wavefronts(ins, itemsize) + _wavefronts(outs, itemsize)


def _plan_rows(t: Transpose, itemsize: int, in_align: int, tile: tuple[int, int, int] | None = None) -> TilePlan:
    """``layout_rows_aligned`` for ``t`` (m == 1): full 16-byte stores although y's rows are odd-length.

    ``tile`` (TA, 1, TD) overrides the tile: TA a multiple of 8 vectors (the store pattern), the staged
    TA + VO - 1 rows of TD elements within the shared-memory limit.
    """
    vo = 16 // itemsize
    # float32: 128 along a (measured on the H100, 128x96x55x55: 87.5% of copy vs 85.3% at 64; 64x96: 80%).
    ta, td = (128 if itemsize == 4 else max(64, 8 * vo), _balanced(t.d, 64)) if tile is None else (tile[0], tile[2])
    if tile is not None and (tile[1] != 1 or ta < 8 * vo or ta % (8 * vo) or td < 1
                             or (ta + vo - 1) * td * itemsize > SMEM_LIMIT):
        raise InputError(f"the rows kernel takes tiles (TA, 1, TD) with TA a multiple of {8 * vo}, got {tile}",
                         "tile")
    vi = _vector(t.d, td, itemsize, in_align)
    la = ta + vo - 1
    candidates = [sd for sd in range(td, td + 33) if la * sd * itemsize <= SMEM_LIMIT] or [td]
    sd = min(candidates, key=lambda s: (rows_bank_conflicts(ta, td, vi, vo, s, itemsize), s))
    tiles_a, tiles_d = -(-t.a // ta), -(-t.d // td)
    grid = t.p * tiles_a * tiles_d
    if grid >= 2**31 or max(t.a, t.d, t.p) >= 2**31:
        raise InputError(f"tensor too large for one launch ({t})", "x")
    return TilePlan(ta, 1, td, vi, vo, sd, 256, tiles_a, 1, tiles_d, grid, kind="rows")


def shifted_bank_conflicts(ta: int, td: int, vi: int, vo: int, sa: int, gv: int, itemsize: int, am: int) -> int:
    """Shared-memory wavefronts of one warp's first staging store in ``layout_rows_shifted`` (worst row shift).

    Lane l holds x's row ``l % (32 // gv)`` and vector ``l // (32 // gv)`` along d; element k goes to staged row
    ``dd = dv + k`` at column ``ra + s(dd)``, where ``s(dd) = (c0 + dd * am) % vo`` (``am = A % vo``) is that
    row's shift.  Its gathers read whole 16-byte vectors of one row: conflict-free for any ``sa``.
    """
    gr, worst = 32 // gv, 0
    for c0 in range(vo):
        lanes = [[(dv + k) * sa + l % gr + (c0 + (dv + k) * am) % vo for k in range(vi)]
                 for l in range(32) for dv in [(l // gr) * vi] if dv < td]
        worst = max(worst, _wavefronts(lanes, itemsize))
    return worst


def _plan_shifted(t: Transpose, itemsize: int, in_align: int, tile: tuple[int, int, int] | None = None,
                  bulk: bool = False, async_loads: bool = False) -> TilePlan:
    """``layout_rows_shifted`` for ``t`` (m == 1): a warp stores 32 consecutive 16-byte vectors of one piece.

    ``tile`` (TA, 1, TD) overrides the tile: TA a multiple of 32 vectors, TD staged rows of TA + VO
    elements (padded to SA) within the shared-memory limit.
    """
    vo = 16 // itemsize
    # 1 KiB pieces (measured, 128x96x55x55 float32 on the H100: 256 x 32 with bulk stores 89.6% of copy,
    # 128 x 48 88%; plain vector stores 88% and 85%; the rows kernel 88%; with cp.async loads 256 x 32 93%,
    # 128 x 32 92%, 128 x 64 91%)
    ta, td = (64 * vo, 32 if async_loads else _balanced(t.d, 32)) if tile is None else (tile[0], tile[2])
    if tile is not None and (tile[1] != 1 or ta < 32 * vo or ta % (32 * vo) or not 1 <= td <= 256
                             or td * (ta + vo) * itemsize > SMEM_LIMIT):
        raise InputError(f"the shifted rows kernel takes tiles (TA, 1, TD) with TA a multiple of {32 * vo}, "
                         f"got {tile}", "tile")
    vi = _vector(t.d, td, itemsize, in_align)
    tiles_a, tiles_d = -(-t.a // ta), -(-t.d // td)
    grid = t.p * tiles_a * tiles_d
    if grid >= 2**31 or max(t.a, t.d, t.p) >= 2**31:
        raise InputError(f"tensor too large for one launch ({t})", "x")
    if async_loads:  # staged rows of SA = 0 (mod 32) words, row dd shifted by 4 * ((dd / 4) % 8) more (28 at most)
        sa = -(-(ta + vo) // 32) * 32
        if itemsize != 4 or td not in (32, 64) or (td * sa + 28) * itemsize > SMEM_LIMIT:
            raise InputError(f"the async kernel takes 4-byte elements and tiles (TA, 1, TD) with TD 32 or 64 "
                             f"within {SMEM_LIMIT} bytes of shared memory, got {(ta, 1, td)}", "tile")
        return TilePlan(ta, 1, td, vi, vo, sa, 256, tiles_a, 1, tiles_d, grid, kind="shifted", bulk=True,
                        async_loads=True)
    ndv = td // vi
    am = t.a % vo
    options = [(sa, gv) for gv in (2, 1) if gv <= ndv for sa in range(ta + vo, ta + vo + 8 * vo, vo)
               if td * sa * itemsize <= SMEM_LIMIT] or [(ta + vo, 1)]
    sa, gv = min(options, key=lambda o: (shifted_bank_conflicts(ta, td, vi, vo, o[0], o[1], itemsize, am),
                                         -o[1], o[0]))
    return TilePlan(ta, 1, td, vi, vo, sa, 256, tiles_a, 1, tiles_d, grid, kind="shifted", gv=gv, bulk=bulk)


def _rows_apply(t: Transpose, itemsize: int, out_align: int) -> bool:
    """Whether y's rows defeat the tile kernel's vector stores and ``layout_rows_aligned`` can take over."""
    full = 16 // itemsize
    return (t.m == 1 and t.a >= SMALL and t.d >= SMALL and t.a % full != 0 and out_align % 16 == 0
            and full > 1)


@lru_cache(maxsize=1024)
def plan_transpose(t: Transpose, itemsize: int, in_align: int = 256, out_align: int = 256,
                   tile: tuple[int, int, int] | None = None, kernel: str | None = None) -> TilePlan:
    """Tile, vectors, padding and grid for ``t`` on elements of ``itemsize`` bytes.

    ``in_align`` / ``out_align``: the largest power of two dividing the data
    pointers (CuPy allocations are 256-byte aligned).  ``tile`` (TA, TM, TD)
    overrides the tile choice, ``kernel`` (one of :data:`KERNELS`) the kernel
    (benchmarks compare them).  By default the transposes whose output rows are
    odd-length (NHWC -> NCHW with odd H * W) go to a rows kernel: "async" (cp.async
    loads, bulk stores) for 4-byte elements, "rows" for the others.
    """
    if itemsize not in _UINT:
        raise InputError(f"element size {itemsize} bytes is not supported (1, 2, 4 or 8)", "x.dtype")
    if kernel is not None and kernel not in KERNELS:
        raise InputError(f"unknown layout kernel {kernel!r}; use one of {', '.join(KERNELS)}", "kernel")
    if kernel in ("rows", "shifted", "bulk", "async") and not _rows_apply(t, itemsize, out_align):
        raise InputError(f"the {kernel} kernel needs m == 1, a, d >= {SMALL} and rows not a multiple of 16 bytes",
                         "kernel")
    if kernel in ("shifted", "bulk", "async"):
        return _plan_shifted(t, itemsize, in_align, tile, bulk=kernel != "shifted", async_loads=kernel == "async")
    if kernel is None and tile is None and _rows_apply(t, itemsize, out_align) and itemsize == 4:
        # cp.async staging (measured on the H100, 128x96x55x55: 93% of copy vs 89% with register loads)
        return _plan_shifted(t, itemsize, in_align, bulk=True, async_loads=True)  # float16: the rows kernel
    if kernel == "rows" or (kernel is None and tile is None and _rows_apply(t, itemsize, out_align)):
        return _plan_rows(t, itemsize, in_align, tile if kernel == "rows" else None)
    ta, tm, td = tile if tile is not None else _tile(t, itemsize)
    vi = _vector(t.d, td, itemsize, in_align)
    vo = _vector(t.a, ta, itemsize, out_align)
    fi = fo = False
    if td == t.d:
        flat = _flat_vector(t.a, t.d, t.m, ta, tm, itemsize, in_align)
        fi, vi = (True, flat) if flat > vi else (False, vi)
    if ta == t.a:
        flat = _flat_vector(t.d, t.a, t.m, td, tm, itemsize, out_align)
        fo, vo = (True, flat) if flat > vo else (False, vo)
    tile = ta * tm * td
    nt = min(256, max(32, _pow2_ceil(-(-tile // max(vi, vo)))))
    rows = ta * tm
    candidates = [sd for sd in range(td, td + 33) if rows * sd * itemsize <= SMEM_LIMIT] or [td]
    sd = min(candidates, key=lambda s: (bank_conflicts(ta, tm, td, vi, vo, s, itemsize), s))
    tiles_a, tiles_m, tiles_d = -(-t.a // ta), -(-t.m // tm), -(-t.d // td)
    grid = t.p * tiles_a * tiles_m * tiles_d
    if grid >= 2**31 or max(t.a, t.m, t.d) >= 2**31:
        raise InputError(f"tensor too large for one launch ({t})", "x")
    return TilePlan(ta, tm, td, vi, vo, sd, nt, tiles_a, tiles_m, tiles_d, grid, fi, fo)


def _align(ptr: int) -> int:
    """The largest power of two up to 256 dividing ``ptr``: what the planner needs, and few distinct cache keys."""
    return min(ptr & -ptr, 256) if ptr else 256


def output_shape(shape: tuple[int, ...], src: str, dst: str) -> tuple[int, ...]:
    _check_layout(src, "src")
    _check_layout(dst, "dst")
    size = dict(zip(src, shape))
    return tuple(size[c] for c in dst)


def transform_layout(x: Any, src: str = "NCHW", dst: str = "NHWC", out: Any = None,
                     tile: tuple[int, int, int] | None = None, kernel: str | None = None) -> Any:
    """``x`` (a 4-D CuPy array in layout ``src``) rearranged into layout ``dst``; a new array unless ``out`` is given.

    ``tile`` overrides the tile shape (TA, TM, TD) and ``kernel`` the kernel (one of :data:`KERNELS`) that
    :func:`plan_transpose` would choose.
    """
    _check_layout(src, "src")
    _check_layout(dst, "dst")
    x = _compile.as_cupy(x, "x")
    if x.ndim != 4:
        raise InputError(f"expected a 4-D array in {src} order, got shape {x.shape}", "x")
    cp = _compile.cupy()
    x = cp.ascontiguousarray(x)
    shape = output_shape(x.shape, src, dst)
    if out is None:
        out = cp.empty(shape, dtype=x.dtype)
    elif tuple(out.shape) != shape or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {x.dtype} array of shape {shape}", "out")
    t = reduce_pair(src, dst, x.shape)
    if t is None:
        cp.copyto(out, x)
        return out
    if x.size == 0:
        return out
    plan = plan_transpose(t, x.dtype.itemsize, _align(x.data.ptr), _align(out.data.ptr), tile, kernel)
    fn = _compile.get_kernel(SOURCE, plan.name_expr(x.dtype.itemsize))
    fn((plan.grid,), (plan.nt,), (x, out) + _arguments(plan, t))
    return out


def _arguments(plan: TilePlan, t: Transpose) -> tuple:
    """The kernel's arguments after (x, y), as ``layout.cu`` declares them for ``plan.kind``."""
    import numpy as np

    i32 = np.int32
    if plan.kind in ("rows", "shifted"):
        return i32(t.a), i32(t.d), i32(plan.tiles_a), i32(plan.tiles_d), i32(t.p)
    return i32(t.a), i32(t.m), i32(t.d), i32(plan.tiles_a), i32(plan.tiles_m), i32(plan.tiles_d)


def launcher(shape: tuple[int, ...], itemsize: int, src: str, dst: str) -> Callable[[int, int], None]:
    """:func:`transform_layout` for one (shape, element size, layout pair), resolved once, on raw device pointers.

    Why: the relayout source (``ucudnn.measure.sources.relayout``) transforms the same
    shapes at every micro-batch, and there transform_layout's checks, array
    wrapping and planning cost more host time than the kernel takes on the
    GPU (measured on an H100 host: 200-265 us for a step's four transforms
    whose GPU work was 20-40 us).  ``launch(x_ptr, y_ptr)`` plans once per
    pointer alignment (cached) and launches on CuPy's current stream.  The
    pointers must address C-contiguous tensors: ``shape`` in ``src`` order
    and its ``dst``-order permutation; nothing else is checked per call.
    """
    _check_layout(src, "src")
    _check_layout(dst, "dst")
    shape = tuple(int(d) for d in shape)
    if len(shape) != 4 or min(shape) < 0:
        raise InputError(f"expected 4 non-negative sizes in {src} order, got {shape}", "shape")
    if itemsize not in _UINT:
        raise InputError(f"element size {itemsize} bytes is not supported (1, 2, 4 or 8)", "itemsize")
    t = reduce_pair(src, dst, shape)
    nbytes = prod(shape) * itemsize
    if t is None or nbytes == 0:
        def copy(x: int, y: int) -> None:
            if nbytes:
                cp = _compile.cupy()
                cp.cuda.runtime.memcpyAsync(y, x, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                            cp.cuda.get_current_stream().ptr)
        return copy
    resolved: dict[tuple[int, int, int], tuple] = {}

    def launch(x: int, y: int) -> None:
        key = (_align(x), _align(y), _compile.cupy().cuda.runtime.getDevice())
        hit = resolved.get(key)
        if hit is None:
            plan = plan_transpose(t, itemsize, key[0], key[1])
            hit = resolved[key] = (_compile.get_kernel(SOURCE, plan.name_expr(itemsize)), (plan.grid,), (plan.nt,),
                                   _arguments(plan, t))
        fn, grid, block, args = hit
        fn(grid, block, (x, y) + args)

    return launch
