"""Fused convolution blocks (seed 004, issue 19; fused.cu): a block description, its launch geometry, launchers on
CuPy arrays, the per-device tile tuner, a float64 NumPy reference of a whole block and a tile-by-tile CPU emulation
of the kernel.

Why fuse: at small batches a block's per-layer kernels are short, each pays a launch, and every intermediate
activation goes to DRAM/L2 and back (plus separate bias and ReLU passes in frameworks).  One kernel per block
keeps the intermediate in shared memory, tile by tile, recomputing the halo a consumer's window needs -- the
seed's "tiling with halos" -- and applies bias and activation (ReLU, ReLU6) in registers.

A :class:`Block` is one of the seed's three modes (``straight``: L1 -> L2; ``split``: L1 -> L2 | L3 concatenated
along channels; ``merge``: act(L1(x) + L2(x2)) -> L3), each layer a :class:`ConvLayer` (filter, stride, pad,
groups, output channels, bias, activation: none, ReLU or ReLU6 -- MobileNet V2's min(max(v, 0), 6)).
:data:`SEED_BLOCKS` holds the seed's four test cases.  The block maps onto the kernel's slots (producers P1, P2 read
x; consumers C1, C2 read the intermediate) and becomes C++ template arguments (:func:`plan`); a :class:`Tiling`
(output tile, channel slices, threads) completes the instantiation.

The kernel's index math is mirrored here -- :func:`tile_origin`, :func:`geometry` (halo region and the consumers'
offsets into it), :func:`stage_work` (each stage's register tiles) -- and :func:`emulate` runs a block tile by tile
and work item by work item, reading inputs, filters (the transposed shared-memory copy included) and the
intermediate at the kernel's offsets.  The CPU tests check it against :func:`reference`.

Producers that are dense 1x1 convolutions (a.1, b.1, c.1) run a pipelined GEMM over input channels
(:func:`pipelined`, :func:`pipe_chunk`: chunks of x over the halo and of the filters staged in shared memory with
the next chunk's loads in flight); others read x from global memory tap by tap.  The default tiling comes from a
cost model (:func:`modelled_time`); :func:`tuned_tiling` hill-climbs the tiling on the device through
kernels/autotune.py and caches the choice per device and shape.

Limits: float32 and float16 (float32 FMA accumulation, no tensor cores; float32 intermediate in shared memory),
NCHW and NHWC (filters [K, C/G, R, S] with NCHW, [K, R, S, C/G] with NHWC, as cuDNN), any batch (grids split
beyond 65535 samples), filters up to 11x11, strides up to 4, dilation 1, samples under 2**31 elements; the
intermediate of one tile's halo, the staged filters and the producer's pipeline buffers must fit one block's
shared memory, and a pipelined producer gives each thread one register tile.  No workspace: the launch writes
``out`` only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ucudnn.errors import InputError

from . import _compile, autotune
from .reference import conv2d_nchw

SOURCE = "fused.cu"
MODES = ("straight", "split", "merge")
DTYPES = {"float32": "float", "float16": "half_t"}
LAYOUTS = ("NCHW", "NHWC")
_ITEMSIZE = {"float32": 4, "float16": 2}
_MAX_Z = 65535
MAX_FILTER, MAX_STRIDE, MAX_CHANNELS = 11, 4, 4096
DEFAULT_SMEM = 99 << 10        # shared memory per block assumed without a device (sm_86 and later allow this much)
SMEM_PER_SM = 228 << 10        # for the occupancy estimate (H100; the CPU's assumption)
DEFAULT_SMS = 132              # multiprocessors assumed without a device (H100 SXM)
#: tuning coordinates (indices into these)
TH_VALUES = (1, 2, 4, 7, 8, 14, 16, 28, 32)
TW_VALUES = (1, 2, 4, 7, 8, 14, 16, 28, 32)
KS_VALUES = (1, 2, 4, 8)
NT_VALUES = (64, 128, 256, 512)
TUNE_MAX_TRIALS = 12
TUNE_FINALISTS, TUNE_ROUNDS = 3, 2
AXES = (TH_VALUES, TW_VALUES, KS_VALUES, NT_VALUES)   # the tuning grid, in Tiling's field order
#: a layer's activation after its bias (ConvLayer.activation; fused.cu ACT_NONE / ACT_RELU / ACT_RELU6)
ACTIVATIONS = ("none", "relu", "relu6")
RELU6_CAP = 6.0


def _pair(v: Any, name: str) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise InputError(f"expected an int or a pair, got {v!r}", name)
        a, b = v
    else:
        a = b = v
    for e in (a, b):
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)):
            raise InputError(f"expected integers, got {v!r}", name)
    return int(a), int(b)


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise InputError(f"expected an integer in [{lo}, {hi}], got {v!r}", name)
    return int(v)


# ---- the block description ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvLayer:
    """One convolution of a block: ``out_channels`` filters of ``kernel`` (int or (r, s)), ``stride``, zero ``pad``
    (int or (ph, pw), both sides), ``groups``; then + bias (``bias``) and ReLU (``relu``) or ReLU6 (``relu6``:
    min(max(v, 0), 6), MobileNet V2's expand and depthwise layers; it replaces the ReLU, so it takes
    ``relu=False``: both set is an :class:`InputError` naming ``relu6``).  Dilation 1."""

    out_channels: int
    kernel: Any = 1
    stride: Any = 1
    pad: Any = 0
    groups: int = 1
    bias: bool = True
    relu: bool = True
    relu6: bool = False

    def __post_init__(self) -> None:
        _int(self.out_channels, "out_channels", 1, MAX_CHANNELS)
        k, s, p = _pair(self.kernel, "kernel"), _pair(self.stride, "stride"), _pair(self.pad, "pad")
        if not all(1 <= v <= MAX_FILTER for v in k):
            raise InputError(f"filters are 1 to {MAX_FILTER} wide, got {self.kernel!r}", "kernel")
        if not all(1 <= v <= MAX_STRIDE for v in s):
            raise InputError(f"strides are 1 to {MAX_STRIDE}, got {self.stride!r}", "stride")
        if not all(0 <= v < f for v, f in zip(p, k)):
            raise InputError(f"pad must be in [0, filter size), got {self.pad!r} for filter {k}", "pad")
        _int(self.groups, "groups", 1, MAX_CHANNELS)
        if self.out_channels % self.groups:
            raise InputError(f"{self.out_channels} output channels do not split into {self.groups} groups", "groups")
        for name in ("bias", "relu", "relu6"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"expected true or false, got {getattr(self, name)!r}", name)
        if self.relu and self.relu6:
            raise InputError("ReLU6 replaces the ReLU: set relu to false with relu6", "relu6")
        object.__setattr__(self, "kernel", k)
        object.__setattr__(self, "stride", s)
        object.__setattr__(self, "pad", p)

    @property
    def activation(self) -> str:
        """The activation after the bias: one of :data:`ACTIVATIONS`."""
        return "relu6" if self.relu6 else "relu" if self.relu else "none"

    def out_plane(self, h: int, w: int) -> tuple[int, int]:
        (r, s), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        return (h + 2 * ph - r) // sh + 1, (w + 2 * pw - s) // sw + 1

    def weight_shape(self, in_channels: int, layout: str) -> tuple[int, int, int, int]:
        r, s = self.kernel
        cg = in_channels // self.groups
        return (self.out_channels, cg, r, s) if layout == "NCHW" else (self.out_channels, r, s, cg)

    def to_dict(self) -> dict:
        """The JSON form; ``relu6`` only where set (the form of every other layer is unchanged)."""
        doc = {"out_channels": self.out_channels, "kernel": list(self.kernel), "stride": list(self.stride),
               "pad": list(self.pad), "groups": self.groups, "bias": self.bias, "relu": self.relu}
        if self.relu6:
            doc["relu6"] = True
        return doc


@dataclass(frozen=True)
class Block:
    """Consecutive convolutions fused into one kernel.

    ``straight``: layers (L1, L2), y = L2(L1(x)).  ``split``: (L1, L2, L3), y = concat(L2(m), L3(m)) along channels,
    m = L1(x) (SqueezeNet fire).  ``merge``: (L1, L2, L3), y = L3(m), m = L1(x) + L2(x2), ReLU'd after the add when
    ``merge_relu`` (ResNet: the residual add of two linear 1x1 convolutions; x2 defaults to x, as the seed's c.1
    lists one input).  Each layer adds its bias and applies its own activation (ReLU or ReLU6) before anything
    else sees its output; ``merge_relu`` is a plain ReLU.
    ``hw``: the input plane the block was described for (benchmarks, defaults); the kernels take any plane."""

    name: str
    mode: str
    in_channels: int
    layers: tuple
    merge_relu: bool = False
    hw: tuple | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError("expected a non-empty string", "name")
        if self.mode not in MODES:
            raise InputError(f"must be one of {MODES}, got {self.mode!r}", "mode")
        _int(self.in_channels, "in_channels", 1, MAX_CHANNELS)
        layers = tuple(self.layers) if isinstance(self.layers, (list, tuple)) else None
        want = 2 if self.mode == "straight" else 3
        if layers is None or len(layers) != want:
            raise InputError(f"a {self.mode} block has {want} layers, got {self.layers!r}", "layers")
        for i, layer in enumerate(layers):
            if not isinstance(layer, ConvLayer):
                raise InputError(f"expected a ConvLayer, got {type(layer).__name__}", f"layers[{i}]")
        object.__setattr__(self, "layers", layers)
        if not isinstance(self.merge_relu, bool):
            raise InputError(f"expected true or false, got {self.merge_relu!r}", "merge_relu")
        if self.merge_relu and self.mode != "merge":
            raise InputError("only a merge block adds two results (and may ReLU the sum)", "merge_relu")
        if self.hw is not None:
            object.__setattr__(self, "hw", _pair(self.hw, "hw"))
            if min(self.hw) < 1:
                raise InputError(f"expected a positive plane, got {self.hw!r}", "hw")
        for i, (layer, cin) in enumerate(zip(layers, self.layer_inputs())):
            if cin % layer.groups:
                raise InputError(f"{cin} input channels do not split into {layer.groups} groups",
                                 f"layers[{i}].groups")
        l1, l2 = layers[0], layers[1]
        if self.mode == "merge":
            if l2.out_channels != l1.out_channels:
                raise InputError(f"merged layers must agree on channels ({l1.out_channels})",
                                 "layers[1].out_channels")
            for attr in ("kernel", "stride", "pad"):
                if getattr(l2, attr) != getattr(l1, attr):
                    raise InputError(f"merged layers must produce the same plane: {attr} {getattr(l2, attr)} vs "
                                     f"{getattr(l1, attr)}", f"layers[1].{attr}")
        if self.mode == "split":
            l3 = layers[2]
            if l3.stride != l2.stride:
                raise InputError(f"concatenated layers share their stride: {l3.stride} vs {l2.stride}",
                                 "layers[2].stride")
            for d in range(2):
                if 2 * l3.pad[d] - l3.kernel[d] != 2 * l2.pad[d] - l2.kernel[d]:
                    raise InputError(f"concatenated layers must produce the same plane: kernel {l3.kernel} pad "
                                     f"{l3.pad} vs kernel {l2.kernel} pad {l2.pad}", "layers[2].pad")

    # -- structure -----------------------------------------------------------------------------------------------
    def layer_inputs(self) -> tuple[int, ...]:
        """Input channels of each layer."""
        l1 = self.layers[0]
        if self.mode == "straight":
            return (self.in_channels, l1.out_channels)
        if self.mode == "split":
            return (self.in_channels, l1.out_channels, l1.out_channels)
        return (self.in_channels, self.in_channels, l1.out_channels)

    def slots(self) -> tuple[int | None, int | None, int, int | None]:
        """Which layer fills the kernel's slots (P1, P2, C1, C2); None: empty."""
        return {"straight": (0, None, 1, None), "split": (0, None, 1, 2), "merge": (0, 1, 2, None)}[self.mode]

    @property
    def mid_channels(self) -> int:
        return self.layers[0].out_channels

    @property
    def out_channels(self) -> int:
        _, _, c1, c2 = self.slots()
        return self.layers[c1].out_channels + (self.layers[c2].out_channels if c2 is not None else 0)

    def planes(self, h: int, w: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(intermediate plane, output plane) for an input plane (h, w)."""
        mid = self.layers[0].out_plane(h, w)
        return mid, self.layers[self.slots()[2]].out_plane(*mid)

    def check_plane(self, h: int, w: int, name: str = "x") -> None:
        mid, out = self.planes(h, w)
        if min(mid) < 1 or min(out) < 1:
            raise InputError(f"an input plane of {h}x{w} leaves no output (intermediate {mid}, output {out})", name)

    def x_shape(self, n: int, h: int, w: int, layout: str = "NCHW") -> tuple[int, int, int, int]:
        return (n, self.in_channels, h, w) if layout == "NCHW" else (n, h, w, self.in_channels)

    def y_shape(self, n: int, h: int, w: int, layout: str = "NCHW") -> tuple[int, int, int, int]:
        _, (p, q) = self.planes(h, w)
        return (n, self.out_channels, p, q) if layout == "NCHW" else (n, p, q, self.out_channels)

    def weight_shapes(self, layout: str = "NCHW") -> list[tuple[int, int, int, int]]:
        return [l.weight_shape(c, layout) for l, c in zip(self.layers, self.layer_inputs())]

    def key(self) -> str:
        """A short stable text of the structure (tuning and cache keys); a ReLU6 layer ends in ``r6`` (the keys of
        blocks without one are what they were before ReLU6 existed)."""
        def one(l: ConvLayer) -> str:
            return (f"k{l.out_channels}f{l.kernel[0]}x{l.kernel[1]}s{l.stride[0]},{l.stride[1]}p{l.pad[0]},{l.pad[1]}"
                    f"g{l.groups}{'b' if l.bias else ''}{'r' if l.relu else ''}{'r6' if l.relu6 else ''}")
        return f"{self.mode}/c{self.in_channels}/" + "/".join(one(l) for l in self.layers) + (
            "/mr" if self.merge_relu else "")

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "in_channels": self.in_channels,
                "layers": [l.to_dict() for l in self.layers], "merge_relu": self.merge_relu,
                "hw": list(self.hw) if self.hw else None}

    @classmethod
    def from_dict(cls, doc: Any) -> "Block":
        """A block from its JSON form; errors name the field as a dotted path (``layers[1].kernel``)."""
        if not isinstance(doc, dict):
            raise InputError(f"expected an object, got {type(doc).__name__}", "block")
        unknown = set(doc) - {"name", "mode", "in_channels", "layers", "merge_relu", "hw"}
        if unknown:
            raise InputError(f"unknown keys {sorted(unknown)}", sorted(unknown)[0])
        raw = doc.get("layers")
        if not isinstance(raw, list):
            raise InputError(f"expected a list of layers, got {raw!r}", "layers")
        layers = []
        for i, l in enumerate(raw):
            if not isinstance(l, dict):
                raise InputError(f"expected an object, got {l!r}", f"layers[{i}]")
            try:
                layers.append(ConvLayer(**l))
            except TypeError as e:
                raise InputError(str(e), f"layers[{i}]") from None
            except InputError as e:
                raise InputError(str(e).split(": ", 1)[-1], f"layers[{i}].{e.field}") from None
        for key in ("name", "mode", "in_channels"):
            if key not in doc:
                raise InputError("missing", key)
        return cls(doc["name"], doc["mode"], doc["in_channels"], tuple(layers), doc.get("merge_relu", False),
                   doc.get("hw"))


def _seed_blocks() -> dict[str, Block]:
    L = ConvLayer
    return {
        # GoogLeNet inception (3a) 5x5 branch: 1x1 reduce + ReLU, 5x5 + ReLU.
        "a.1": Block("a.1", "straight", 192, (L(16, 1), L(32, 5, pad=2)), hw=(28, 28)),
        # MobileNet (V2 convention): depthwise 3x3 + ReLU, then the linear 1x1 projection (no ReLU).
        "a.2": Block("a.2", "straight", 16, (L(16, 3, pad=1, groups=16), L(16, 1, relu=False)), hw=(80, 80)),
        # SqueezeNet fire: squeeze 1x1 + ReLU, expand 1x1 + ReLU | expand 3x3 + ReLU, concatenated.
        "b.1": Block("b.1", "split", 64, (L(16, 1), L(64, 1), L(64, 3, pad=1)), hw=(56, 56)),
        # ResNet: the bottleneck's last 1x1 and the projection shortcut's 1x1 (linear, BN folded into the bias),
        # the residual add and its ReLU, then the next bottleneck's first 1x1 + ReLU.
        "c.1": Block("c.1", "merge", 64, (L(256, 1, relu=False), L(256, 1, relu=False), L(64, 1)), merge_relu=True,
                     hw=(56, 56)),
    }


#: The seed's four test cases (Table 1), with the ReLU conventions of the networks they come from.
SEED_BLOCKS: dict[str, Block] = _seed_blocks()


# ---- tiling ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiling:
    """``th`` x ``tw`` output tile per thread block, ``ks`` slices of every consumer's channels (one block each:
    more blocks at small batches, each recomputing the intermediate), ``nt`` threads."""

    th: int
    tw: int
    ks: int = 1
    nt: int = 256

    def __post_init__(self) -> None:
        _int(self.th, "tiling.th", 1, 64)
        _int(self.tw, "tiling.tw", 1, 64)
        _int(self.ks, "tiling.ks", 1, 64)
        if self.nt not in NT_VALUES:
            raise InputError(f"must be one of {NT_VALUES}, got {self.nt!r}", "tiling.nt")

    def as_list(self) -> list[int]:
        return [self.th, self.tw, self.ks, self.nt]

    @classmethod
    def from_list(cls, v: Any) -> "Tiling":
        if not isinstance(v, (list, tuple)) or len(v) != 4:
            raise InputError(f"expected [th, tw, ks, nt], got {v!r}", "tiling")
        return cls(*v)

    def coordinates(self) -> tuple[int, int, int, int] | None:
        try:
            return (TH_VALUES.index(self.th), TW_VALUES.index(self.tw), KS_VALUES.index(self.ks),
                    NT_VALUES.index(self.nt))
        except ValueError:
            return None

    @classmethod
    def at(cls, coords: tuple[int, ...]) -> "Tiling | None":
        values = autotune.grid_point(AXES, coords)
        return None if values is None else cls(*values)


# ---- geometry mirrored from fused.cu ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """fused.cu's Geometry<P1, P2, C1, C2, Tile>: the halo region (MH x MW, from (p0*sh - loh, q0*sw - low)), the
    consumers' offsets into it, channel slices, shared-memory parts (floats) and the stages' register tiles."""

    sh: int
    sw: int
    loh: int
    low: int
    mh: int
    mw: int
    km: int
    k1s: int
    k2s: int
    ky: int
    ws1: bool
    ws2: bool
    mid_floats: int
    ws1_floats: int
    ws2_floats: int
    off1: tuple[int, int]
    off2: tuple[int, int]
    producer: tuple[int, int]      # (PX, KT)
    consumer1: tuple[int, int]
    consumer2: tuple[int, int]
    pcc: int = 0                   # > 0: the pipelined 1x1 producer, input channels per stage
    nprod: int = 1
    kmp: int = 0                   # row length of a staged filter chunk [PCC][KMP]
    xbuf: int = 0                  # floats of one buffer's x part ([NPROD][PCC][MPLANE], rounded to 4)
    wbuf: int = 0                  # floats of one buffer's filter part ([NPROD][PCC][KMP])

    @property
    def mplane(self) -> int:
        return self.mh * self.mw

    @property
    def pipe_floats(self) -> int:
        return 2 * (self.xbuf + self.wbuf) if self.pcc else 0

    @property
    def smem_bytes(self) -> int:
        return 4 * (self.mid_floats + self.ws1_floats + self.ws2_floats + self.pipe_floats)


def _layer(block: Block, slot: int | None) -> tuple[ConvLayer | None, int]:
    if slot is None:
        return None, 0
    return block.layers[slot], block.layer_inputs()[slot]


def staged(layer: ConvLayer | None, cin: int) -> bool:
    """A consumer whose filters are staged in shared memory (transposed): R*S > 1 and more than one input channel
    per group (each tap then feeds several outputs from one vector load)."""
    return layer is not None and layer.kernel[0] * layer.kernel[1] > 1 and cin // layer.groups > 1


def pipelined(block: Block) -> bool:
    """The producers run fused.cu's produce_pipelined: every producer a 1x1 convolution of one group (the
    reduction is then a plain GEMM over input channels, staged PCC channels at a time with loads in flight)."""
    p1s, p2s, _, _ = block.slots()
    return all(block.layers[s].kernel == (1, 1) and block.layers[s].groups == 1 for s in (p1s, p2s) if s is not None)


PIPE_REGS = 48         # registers per thread the pipelined producer's prefetched chunk may hold


def pipe_chunk(nprod: int, npix: int, km: int, cins: Sequence[int], nt: int) -> int:
    """Input channels per stage of the pipelined producer: the largest of 32, 16, 8, 4 (no more than the channels,
    rounded up to 4) whose prefetched elements fit PIPE_REGS registers per thread -- an x element holds its value
    and its shared offset (2), a filter element 2, or 1.25 when the filters move 4 channels per load (every
    producer's channels a multiple of 4, fused.cu's FV)."""
    cap = max(4, -(-max(cins) // 4) * 4)
    per_w = 1.25 if all(c % 4 == 0 for c in cins) else 2.0
    for cc in (32, 16, 8, 4):
        if cc <= cap and 2 * nprod * cc * npix + per_w * nprod * cc * km <= PIPE_REGS * nt:
            return cc
    return 4


def weight_vector(layer: ConvLayer, cin: int) -> int:
    """Input channels a 1x1 layer's filters are read at once (fused.cu weight_vector)."""
    cg = cin // layer.groups
    if layer.kernel != (1, 1):
        return 1
    return 4 if cg % 4 == 0 else 2 if cg % 2 == 0 else 1


def _divisors(n: int, cap: int = 16) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16) if d <= cap and n % d == 0]


def stage_cost(px: int, kt: int, npix: int, nk: int, nt: int, red: int, x_loads: int, w_loads: float) -> float:
    """A model of one stage's time in a block (arbitrary units): per reduction step a thread issues px*kt FMAs and
    ``x_loads + w_loads`` loads (4 FMA pipes per load pipe); the busiest thread runs ``rounds`` items (latency
    bound) and the block's items share 128 FMA lanes (throughput bound)."""
    pb = -(-npix // px)
    items = pb * (nk // kt)
    rounds = -(-items // nt)
    step = max(px * kt, 4 * (x_loads + w_loads))
    return red * step * max(rounds, items / 128)


def stage_work(npix: int, nk: int, nt: int, red: int, *, shared: Callable[[int], bool],
               w_loads: Callable[[int], float], group_kt: int = 0, one_item: bool = False) -> tuple[int, int]:
    """(PX, KT) of a stage: ``npix`` pixels x ``nk`` channels, reduction length ``red``; ``shared(kt)``: the kt
    filters read one input channel per step (else kt); ``w_loads(kt)``: filter loads per step.  The cheapest by
    :func:`stage_cost` with at most 32 accumulators (16 at 512 threads); ties: fewer items, then fewer pixels.
    ``group_kt``: a staged consumer's filters per group -- its KT filters must lie in one group.  ``one_item``: at
    most ``nt`` items (the pipelined producer: one per thread); an :class:`InputError` (``tiling``) if none fits."""
    cap = 16 if nt >= 512 else 32
    best: tuple | None = None
    for kt in _divisors(nk):
        if group_kt and group_kt % kt:
            continue
        for px in range(1, 9):
            if px * kt > cap or px > npix:
                continue
            if one_item and -(-npix // px) * (nk // kt) > nt:
                continue
            xl = px if shared(kt) else px * kt
            cost = stage_cost(px, kt, npix, nk, nt, red, xl, w_loads(kt))
            items = -(-npix // px) * (nk // kt)
            cand = (cost, items, px, kt)
            if best is None or cand < best:
                best = cand
    if best is None:
        raise InputError(f"no register tile covers {npix} x {nk} outputs with one item per thread", "tiling")
    return best[2], best[3]


def _vw(kt: int, ksl: int) -> int:
    return 4 if kt % 4 == 0 and ksl % 4 == 0 else 2 if kt % 2 == 0 and ksl % 2 == 0 else 1


def geometry(block: Block, t: Tiling) -> Geometry:
    """The instantiation's compile-time geometry; an :class:`InputError` naming ``tiling.ks`` if the slices do not
    divide every consumer's channels."""
    p1s, p2s, c1s, c2s = block.slots()
    p1, cin1 = _layer(block, p1s)
    p2, cin2 = _layer(block, p2s)
    c1, cc1 = _layer(block, c1s)
    c2, cc2 = _layer(block, c2s)
    cons = [c for c in (c1, c2) if c is not None]
    for c in cons:
        if c.out_channels % t.ks:
            raise InputError(f"{t.ks} slices do not divide {c.out_channels} output channels", "tiling.ks")
    sh, sw = c1.stride
    loh, low = max(c.pad[0] for c in cons), max(c.pad[1] for c in cons)
    hih = max(c.kernel[0] - 1 - c.pad[0] for c in cons)
    hiw = max(c.kernel[1] - 1 - c.pad[1] for c in cons)
    mh, mw = (t.th - 1) * sh + loh + hih + 1, (t.tw - 1) * sw + low + hiw + 1
    km = p1.out_channels
    k1s = c1.out_channels // t.ks
    k2s = c2.out_channels // t.ks if c2 else 0
    ws1, ws2 = staged(c1, cc1), staged(c2, cc2)
    mid_floats = -(-km * mh * mw // 4) * 4
    ws1_f = (cc1 // c1.groups) * c1.kernel[0] * c1.kernel[1] * k1s if ws1 else 0
    ws2_f = (cc2 // c2.groups) * c2.kernel[0] * c2.kernel[1] * k2s if ws2 else 0

    def red(layer: ConvLayer, cin: int) -> int:
        return (cin // layer.groups) * layer.kernel[0] * layer.kernel[1]

    def loads(layer: ConvLayer, cin: int, ws: bool, ksl: int) -> Callable[[int], float]:
        if ws:
            return lambda kt: kt / _vw(kt, ksl)
        if layer.kernel == (1, 1):
            wv = weight_vector(layer, cin)
            return lambda kt: kt / wv if (layer.out_channels // layer.groups) % kt == 0 else kt
        return lambda kt: kt

    def shared(layer: ConvLayer) -> Callable[[int], bool]:
        kg = layer.out_channels // layer.groups
        return lambda kt: kg % kt == 0

    producers = [(p1, cin1)] + ([(p2, cin2)] if p2 else [])
    pred = sum(red(l, c) for l, c in producers)
    pipe = pipelined(block)
    if pipe:   # x and filters from the staged chunk: one LDS per pixel, filters in vectors of 4
        prod = stage_work(mh * mw, km, t.nt, pred, shared=lambda kt: True, w_loads=lambda kt: kt / _vw(kt, 4),
                          one_item=True)
    else:
        prod = stage_work(mh * mw, km, t.nt, pred, shared=lambda kt: all(shared(l)(kt) for l, _ in producers),
                          w_loads=loads(p1, cin1, False, km))
    con1 = stage_work(t.th * t.tw, k1s, t.nt, red(c1, cc1), shared=shared(c1), w_loads=loads(c1, cc1, ws1, k1s),
                      group_kt=ws1 and c1.out_channels // c1.groups)
    con2 = (stage_work(t.th * t.tw, k2s, t.nt, red(c2, cc2), shared=shared(c2), w_loads=loads(c2, cc2, ws2, k2s),
                       group_kt=ws2 and c2.out_channels // c2.groups) if c2 else (1, 1))
    nprod = len(producers)
    pcc = pipe_chunk(nprod, mh * mw, km, [c for _, c in producers], t.nt) if pipe else 0
    kmp = -(-km // 4) * 4 + 4
    xbuf = -(-nprod * pcc * mh * mw // 4) * 4
    return Geometry(sh, sw, loh, low, mh, mw, km, k1s, k2s, c1.out_channels + (c2.out_channels if c2 else 0), ws1, ws2,
                    mid_floats, ws1_f, ws2_f, (loh - c1.pad[0], low - c1.pad[1]),
                    ((loh - c2.pad[0], low - c2.pad[1]) if c2 else (0, 0)), prod, con1, con2, pcc, nprod,
                    kmp if pipe else 0, xbuf, nprod * pcc * kmp if pipe else 0)


def tiles(block: Block, t: Tiling, h: int, w: int) -> tuple[int, int]:
    """(tile rows, tile columns) of the output plane."""
    _, (p, q) = block.planes(h, w)
    return -(-p // t.th), -(-q // t.tw)


def tile_origin(block_x: int, block: Block, t: Tiling, h: int, w: int) -> tuple[int, int]:
    """(p0, q0) of thread block ``block_x``'s output tile (fused.cu: tiles row-major)."""
    _, tq = tiles(block, t, h, w)
    return (block_x // tq) * t.th, (block_x % tq) * t.tw


def halo_window(block: Block, t: Tiling, p0: int, q0: int) -> tuple[int, int, int, int]:
    """(first row, first column, rows, columns) of the intermediate a tile at (p0, q0) produces -- the union of the
    consumers' windows; may reach outside the intermediate plane (stored as zeros: the consumers' padding)."""
    g = geometry(block, t)
    return p0 * g.sh - g.loh, q0 * g.sw - g.low, g.mh, g.mw


def input_window(block: Block, t: Tiling, p0: int, q0: int, producer: int = 0) -> tuple[int, int, int, int]:
    """(first row, first column, rows, columns) of the input a tile's producer reads (x; producer 1: x2)."""
    m0, n0, mh, mw = halo_window(block, t, p0, q0)
    layer = block.layers[block.slots()[producer]]
    (r, s), (sh, sw), (ph, pw) = layer.kernel, layer.stride, layer.pad
    return m0 * sh - ph, n0 * sw - pw, (mh - 1) * sh + r, (mw - 1) * sw + s


# ---- launch geometry -------------------------------------------------------------------------------------------------
def _layer_type(layer: ConvLayer | None, cin: int) -> str:
    if layer is None:
        return "NoLayer"
    (r, s), (sh, sw), (ph, pw) = layer.kernel, layer.stride, layer.pad
    b = "true" if layer.bias else "false"
    a = "true" if layer.relu else "false"
    a6 = ",true" if layer.relu6 else ""    # Layer's RELU6 (defaults to false: other layers' names are unchanged)
    return f"Layer<{layer.out_channels},{cin},{r},{s},{sh},{sw},{ph},{pw},{layer.groups},{b},{a}{a6}>"


@dataclass(frozen=True)
class LaunchGeometry:
    name_expr: str
    grid: tuple[int, int, int]       # (tiles, ks, N); the launcher splits N beyond 65535
    block: int
    smem_bytes: int
    ints: tuple[int, ...]            # H, W, H2, W2, MP, MQ, P, Q
    x_sample: int                    # elements per sample of x, x2 and y
    x2_sample: int
    y_sample: int


def plan(block: Block, t: Tiling, dtype: str, layout: str, n: int, h: int, w: int) -> LaunchGeometry:
    """The launch of ``block`` on an input of ``n`` x ``h`` x ``w`` with tiling ``t``."""
    if dtype not in DTYPES:
        raise InputError(f"must be one of {tuple(DTYPES)}, got {dtype!r}", "dtype")
    if layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {layout!r}", "layout")
    _int(n, "x", 1, 2 ** 31 - 1)
    block.check_plane(h, w)
    g = geometry(block, t)
    (mp, mq), (p, q) = block.planes(h, w)
    p1s, p2s, c1s, c2s = block.slots()
    types = [_layer_type(*_layer(block, s)) for s in (p1s, p2s, c1s, c2s)]
    mrelu = "true" if block.merge_relu else "false"
    tile = (f"Tile<{t.th},{t.tw},{t.ks},{t.nt},{g.producer[0]},{g.producer[1]},{g.consumer1[0]},{g.consumer1[1]},"
            f"{g.consumer2[0]},{g.consumer2[1]},{g.pcc}>")
    nhwc = "true" if layout == "NHWC" else "false"
    expr = f"fused_block<{DTYPES[dtype]},{nhwc},{','.join(types)},{mrelu},{tile}>"
    tp, tq = tiles(block, t, h, w)
    c = block.in_channels
    if max(c * h * w, g.ky * p * q, g.km * mp * mq) >= 2 ** 31:
        raise InputError("a sample of 2**31 elements or more (the kernel indexes a sample in 32 bits)", "x")
    x2s = c * h * w if block.mode == "merge" else 0
    return LaunchGeometry(expr, (tp * tq, t.ks, n), t.nt, g.smem_bytes, (h, w, h, w, mp, mq, p, q), c * h * w, x2s,
                          g.ky * p * q)


def fits(block: Block, t: Tiling, smem_limit: int = DEFAULT_SMEM) -> bool:
    try:
        return geometry(block, t).smem_bytes <= smem_limit
    except InputError:
        return False


def _occupancy(smem: int, nt: int, accs: int) -> int:
    regs = 128 if accs >= 32 else 64
    by_smem = SMEM_PER_SM // max(smem + 1024, 1)
    return max(1, min(by_smem, 2048 // nt, 65536 // (nt * regs), 32))


def modelled_time(block: Block, t: Tiling, n: int, h: int, w: int, sms: int = DEFAULT_SMS) -> float:
    """The cost model the default tiling minimises (arbitrary units): per block, the producer's and consumers'
    :func:`stage_cost` (latency: the busiest thread; throughput: all items over 128 lanes) plus filter staging and a
    fixed cost per block; blocks spread over ``sms`` multiprocessors, several resident where shared memory,
    threads and registers allow."""
    g = geometry(block, t)
    p1s, p2s, c1s, c2s = block.slots()
    lat = thr = 0.0
    stages = []
    producers = [_layer(block, s) for s in (p1s, p2s) if s is not None]
    pred = sum((c // l.groups) * l.kernel[0] * l.kernel[1] for l, c in producers)
    kg1 = producers[0][0].out_channels // producers[0][0].groups
    wv = weight_vector(*producers[0])
    stages.append((g.producer, g.mplane, g.km, pred, kg1, 4 if g.pcc else wv, bool(g.pcc)))
    for slot, (px_kt), ksl, ws in ((c1s, g.consumer1, g.k1s, g.ws1), (c2s, g.consumer2, g.k2s, g.ws2)):
        if slot is None:
            continue
        l, c = _layer(block, slot)
        stages.append((px_kt, t.th * t.tw, ksl, (c // l.groups) * l.kernel[0] * l.kernel[1],
                       l.out_channels // l.groups, weight_vector(l, c), ws))
    for (px, kt), npix, nk, red, kg, wvec, ws in stages:
        xl = px if kg % kt == 0 else px * kt
        wl = kt / _vw(kt, nk) if ws else (kt / wvec if kg % kt == 0 else kt)
        items = -(-npix // px) * (nk // kt)
        step = max(px * kt, 4 * (xl + wl))
        lat += red * step * -(-items // t.nt)
        thr += red * step * items / 128
    staging = 8.0 * (g.ws1_floats + g.ws2_floats) / t.nt + (600 if g.ws1 or g.ws2 else 0)
    if g.pcc:   # one L2 round trip per stage of channels, overlapped with the previous stage's arithmetic
        nch = -(-max(c for l, c in producers) // g.pcc)
        lat += nch * 400
    fixed = 1500.0
    lat += staging + fixed
    thr += staging * t.nt / 128 + fixed / 4
    tp, tq = tiles(block, t, h, w)
    blocks = tp * tq * t.ks * n
    occ = _occupancy(g.smem_bytes, t.nt, max(g.producer[0] * g.producer[1], g.consumer1[0] * g.consumer1[1]))
    return max(-(-blocks // sms) * thr, -(-blocks // (sms * occ)) * lat)


def default_tiling(block: Block, n: int, h: int, w: int, smem_limit: int = DEFAULT_SMEM,
                   sms: int = DEFAULT_SMS) -> Tiling:
    """The tiling :func:`modelled_time` ranks first among the tuning grid's tiles no more than twice the output plane,
    channel slices that divide, 128 or 256 threads, that fit ``smem_limit``.  Why a model: small batches want many
    small tiles (every SM busy) and large ones fewer, larger tiles (less halo recomputed); the model weighs exactly
    that, so an untuned launch is sensible at any batch."""
    block.check_plane(h, w)
    _, (p, q) = block.planes(h, w)
    best: tuple[float, Tiling] | None = None
    for th in TH_VALUES:
        if th > 1 and th >= 2 * p:
            continue
        for tw in TW_VALUES:
            if (tw > 1 and tw >= 2 * q) or th * tw > 1024:
                continue
            for ks in KS_VALUES:
                for nt in (128, 256):
                    t = Tiling(th, tw, ks, nt)
                    if not fits(block, t, smem_limit):
                        continue
                    cost = modelled_time(block, t, n, h, w, sms)
                    if best is None or cost < best[0]:
                        best = (cost, t)
    if best is None:
        raise InputError(f"no tiling of block {block.name} fits {smem_limit} bytes of shared memory", "block")
    return best[1]


# ---- launching -------------------------------------------------------------------------------------------------------
Launch = Callable[..., None]


def smem_limit() -> int:
    cp = _compile.cupy()
    return int(cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id))  # MaxSharedMemoryPerBlockOptin


def sm_count() -> int:
    cp = _compile.cupy()
    return int(cp.cuda.runtime.deviceGetAttribute(16, cp.cuda.Device().id))  # MultiProcessorCount


def _check(a: Any, name: str, shape: tuple, dtype: str, align: int = 1) -> int:
    if getattr(a, "shape", None) != tuple(shape):
        raise InputError(f"expected shape {tuple(shape)}, got {getattr(a, 'shape', None)}", name)
    if str(a.dtype) != dtype:
        raise InputError(f"expected {dtype}, got {a.dtype}", name)
    if not a.flags.c_contiguous:
        raise InputError("must be C-contiguous", name)
    ptr = int(a.data.ptr)
    if ptr % align:
        raise InputError(f"must be {align}-byte aligned for the kernel's vector loads (pass a fresh copy)", name)
    return ptr


def layer_ptrs(block: Block, weights: Sequence[Any], biases: Sequence[Any], w_shapes: Sequence[tuple],
               dtype: str, aligns: Sequence[int]) -> tuple[list[int], list[int]]:
    """Every layer's weight and bias device pointers (0: no bias), checked against the block for the fused-block
    launchers: one of each per layer, shapes ``w_shapes``, ``dtype``, C-contiguous, weights ``aligns[i]``-byte
    aligned, a bias exactly where the layer has one.  InputError naming ``weights[i]`` / ``biases[i]``."""
    if len(weights) != len(block.layers) or len(biases) != len(block.layers):
        raise InputError(f"expected {len(block.layers)} weights and biases, got {len(weights)} and {len(biases)}",
                         "weights")
    wp, bp = [], []
    for i, (layer, wa, ba) in enumerate(zip(block.layers, weights, biases)):
        wp.append(_check(wa, f"weights[{i}]", w_shapes[i], dtype, aligns[i]))
        if layer.bias:
            if ba is None:
                raise InputError("the layer has a bias", f"biases[{i}]")
            bp.append(_check(ba, f"biases[{i}]", (layer.out_channels,), dtype))
        else:
            if ba is not None:
                raise InputError("the layer has no bias (bias=False)", f"biases[{i}]")
            bp.append(0)
    return wp, bp


def launcher(block: Block, t: Tiling, dtype: str, layout: str, x_shape: Sequence[int]) -> Launch:
    """``launch(x, weights, biases, out, x2=None)`` on CuPy arrays: ``weights[i]`` / ``biases[i]`` per layer of
    ``block.layers`` (a bias None where the layer has none), ``out`` of :meth:`Block.y_shape`; merge blocks read
    ``x2`` (default ``x``).  Runs on CuPy's current stream; compiles here (NVRTC, cached), so launching checks
    shapes, allocates nothing, never synchronises and can be captured in a CUDA graph."""
    x_shape = tuple(int(v) for v in x_shape)
    if len(x_shape) != 4:
        raise InputError(f"expected a 4-D input shape, got {x_shape}", "x")
    n, h, w = (x_shape[0], x_shape[2], x_shape[3]) if layout == "NCHW" else x_shape[:3]
    want_x = block.x_shape(n, h, w, layout)
    if x_shape != want_x:
        raise InputError(f"expected an input of shape {want_x} for {block.in_channels} channels, got {x_shape}", "x")
    geo = plan(block, t, dtype, layout, n, h, w)
    kernel = _compile.get_kernel(SOURCE, geo.name_expr)
    if geo.smem_bytes > 48 << 10:
        limit = smem_limit()
        if geo.smem_bytes > limit:
            raise InputError(f"tiling {t.as_list()} needs {geo.smem_bytes} bytes of shared memory, the device allows "
                             f"{limit}", "tiling")
        kernel.max_dynamic_shared_size_bytes = geo.smem_bytes
    size = _ITEMSIZE[dtype]
    y_shape = block.y_shape(n, h, w, layout)
    w_shapes = block.weight_shapes(layout)
    aligns = [size * weight_vector(l, c) for l, c in zip(block.layers, block.layer_inputs())]
    ints = tuple(np.int32(v) for v in geo.ints)
    gx, gy, _ = geo.grid
    parts = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]
    slot_of = block.slots()
    merge = block.mode == "merge"

    def launch(x: Any, weights: Sequence[Any], biases: Sequence[Any], out: Any, x2: Any = None) -> None:
        xp = _check(x, "x", want_x, dtype)
        x2p = _check(x2, "x2", want_x, dtype) if (merge and x2 is not None) else xp
        wp, bp = layer_ptrs(block, weights, biases, w_shapes, dtype, aligns)
        yp = _check(out, "out", y_shape, dtype)
        slots = []
        for s in slot_of:
            slots += [0, 0] if s is None else [wp[s], bp[s]]
        for n0, cnt in parts:
            kernel((gx, gy, cnt), (geo.block,),
                   (xp + n0 * geo.x_sample * size, x2p + n0 * geo.x_sample * size, *slots,
                    yp + n0 * geo.y_sample * size) + ints, shared_mem=geo.smem_bytes)

    return launch


_launchers: dict[tuple, Launch] = {}


def fused_forward(block: Block, x: Any, weights: Sequence[Any], biases: Sequence[Any], out: Any, x2: Any = None,
                  tiling: Tiling | None = None, layout: str = "NCHW") -> Any:
    """Run ``block`` on CuPy arrays: ``out`` = the block's output (see :func:`launcher`); the tiling defaults to the
    tuned one cached for this device and shape, else :func:`default_tiling`.  Returns ``out``."""
    if layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {layout!r}", "layout")
    dtype = str(x.dtype)
    n, h, w = (x.shape[0], x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[:3]
    if tiling is None:
        tiling, _ = tuned_tiling(block, dtype, layout, tuple(x.shape), None)
    key = (block, tiling, dtype, layout, tuple(x.shape))
    run = _launchers.get(key)
    if run is None:
        run = _launchers[key] = launcher(block, tiling, dtype, layout, x.shape)
    run(x, weights, biases, out, x2)
    return out


# ---- tuning ----------------------------------------------------------------------------------------------------------
def tuning_key(block: Block, dtype: str, layout: str, x_shape: Sequence[int]) -> str:
    return f"fused/{block.key()}/{dtype}/{layout}/{'x'.join(map(str, x_shape))}"


def tuned_tiling(block: Block, dtype: str, layout: str, x_shape: Sequence[int],
                 operands: tuple[Any, Sequence[Any], Sequence[Any], Any, Any] | None, tune: bool = True,
                 timer: Callable[[Callable[[], None]], float] | None = None) -> tuple[Tiling, str]:
    """(tiling, how): ``cache`` (tuned before on this device and shape), ``climb`` (tuned now: a hill climb over the
    tiling's coordinates from :func:`default_tiling`, on ``operands`` = (x, weights, biases, out, x2), whose ``out``
    it overwrites, then :func:`autotune.confirm`), or ``default`` (``tune`` False or no operands)."""
    limit = smem_limit()
    n, h, w = (x_shape[0], x_shape[2], x_shape[3]) if layout == "NCHW" else tuple(x_shape[:3])
    _, (p, q) = block.planes(h, w)
    timed = None
    if tune and operands is not None:
        if timer is None:
            from ucudnn.binding.timing import time_ms

            def timer(fn: Callable[[], None]) -> float:
                return time_ms(fn, repeat=5, warmup=2, min_sample_ms=0.2)

        def timed(t: Tiling) -> float:
            launch = launcher(block, t, dtype, layout, x_shape)
            return float(timer(lambda: launch(*operands)))

    return autotune.tuned_grid(
        _compile.device_key(), tuning_key(block, dtype, layout, x_shape), AXES,
        default_tiling(block, n, h, w, limit, sm_count()), Tiling.at, lambda t: fits(block, t, limit),
        lambda t: not ((t.th > 1 and t.th >= 2 * p) or (t.tw > 1 and t.tw >= 2 * q)), timed,
        TUNE_MAX_TRIALS, TUNE_FINALISTS, TUNE_ROUNDS)


# ---- float64 reference -----------------------------------------------------------------------------------------------
def _nchw(a: np.ndarray, layout: str) -> np.ndarray:
    """A tensor or a filter bank of ``layout`` in float64 NCHW order: NHWC data [N, H, W, C] and NHWC filters
    [K, R, S, C/G] take the same permutation."""
    return np.asarray(a, np.float64).transpose(0, 3, 1, 2) if layout == "NHWC" else np.asarray(a, np.float64)


def activate(v: np.ndarray, activation: str) -> np.ndarray:
    """fused.cu act<ACT>: ``activation`` (one of :data:`ACTIVATIONS`) applied elementwise."""
    if activation == "relu6":
        return np.minimum(np.maximum(v, 0), RELU6_CAP)
    if activation == "relu":
        return np.maximum(v, 0)
    if activation != "none":
        raise ValueError(f"unknown activation {activation!r}")
    return v


def _merge_act(block: Block) -> str:
    return "relu" if block.merge_relu else "none"


def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layer: ConvLayer) -> np.ndarray:
    """One layer in float64, NCHW: conv + bias (+ ReLU or ReLU6)."""
    y = conv2d_nchw(x, w, layer.pad, layer.stride, (1, 1), layer.groups)
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return activate(y, layer.activation)


def reference(block: Block, x: np.ndarray, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None],
              x2: np.ndarray | None = None, layout: str = "NCHW") -> np.ndarray:
    """The whole block in float64 (NumPy), per layer and unfused, in ``layout``."""
    xs = _nchw(x, layout)
    ws = [_nchw(w, layout) for w in weights]
    bs = [None if (b is None or not l.bias) else np.asarray(b, np.float64) for b, l in zip(biases, block.layers)]
    L = block.layers
    if block.mode == "straight":
        y = conv_reference(conv_reference(xs, ws[0], bs[0], L[0]), ws[1], bs[1], L[1])
    elif block.mode == "split":
        m = conv_reference(xs, ws[0], bs[0], L[0])
        y = np.concatenate([conv_reference(m, ws[1], bs[1], L[1]), conv_reference(m, ws[2], bs[2], L[2])], axis=1)
    else:
        x2s = xs if x2 is None else _nchw(x2, layout)
        m = conv_reference(xs, ws[0], bs[0], L[0]) + conv_reference(x2s, ws[1], bs[1], L[1])
        if block.merge_relu:
            m = np.maximum(m, 0)
        y = conv_reference(m, ws[2], bs[2], L[2])
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1)) if layout == "NHWC" else y


# ---- the kernel, emulated tile by tile -------------------------------------------------------------------------------
def _pix_at(layout: str, h: Any, w: Any, c: int, width: int) -> Any:
    return (h * width + w) * c if layout == "NHWC" else h * width + w


def _filt(layout: str, layer: ConvLayer, cg: int, k: Any, c: Any, i: Any, j: Any) -> Any:
    r, s = layer.kernel
    return ((k * r + i) * s + j) * cg + c if layout == "NHWC" else ((k * cg + c) * r + i) * s + j


def stage_order(layer: ConvLayer, cin: int, ksl: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """fused.cu stage_weights: for every element it stages, (shared offset, source offset relative to the slice's
    first filter) -- lanes walk 4 consecutive source elements x 8 filters."""
    cg = cin // layer.groups
    rs = layer.kernel[0] * layer.kernel[1]
    cgrs = cg * rs
    k8, r4 = -(-ksl // 8), -(-cgrs // 4)
    e = np.arange(32 * k8 * r4)
    chunk = e >> 5
    kk = (chunk % k8) * 8 + ((e >> 2) & 7)
    r = (chunk // k8) * 4 + (e & 3)
    keep = (kk < ksl) & (r < cgrs)
    kk, r = kk[keep], r[keep]
    if layout == "NHWC":
        ij, cc = r // cg, r % cg
    else:
        cc, ij = r // rs, r % rs
    return (cc * rs + ij) * ksl + kk, kk * cgrs + r


def _items(npix: int, nk: int, px: int, kt: int) -> list[tuple[int, int, list[int]]]:
    """The work items of a stage in the kernel's order: (first channel, pixel slot, pixels or -1 past the end)."""
    pb = -(-npix // px)
    out = []
    for item in range(pb * (nk // kt)):
        kb, ps = divmod(item, pb)
        out.append((kb * kt, ps, [ps + u * pb if ps + u * pb < npix else -1 for u in range(px)]))
    return out


def _reduce_global(layout: str, layer: ConvLayer, cin: int, x: np.ndarray, h: int, w: int, hb: np.ndarray,
                   wb: np.ndarray, wflat: np.ndarray, k0: int, kt: int) -> np.ndarray:
    """fused.cu reduce_global over (samples, PX, KT): x read at (hb + i, wb + j), zero outside the plane."""
    cg, kg = cin // layer.groups, layer.out_channels // layer.groups
    r, s = layer.kernel
    cs = 1 if layout == "NHWC" else h * w
    k = k0 + np.arange(kt)
    cc, i, j = np.arange(cg), np.arange(r), np.arange(s)
    c = (k[:, None] // kg) * cg + cc[None, :]                                     # (KT, CG)
    hh = hb[:, None] + i[None, :]                                                 # (PX, R)
    ww = wb[:, None] + j[None, :]                                                 # (PX, S)
    ok = ((hh >= 0) & (hh < h))[:, None, None, :, None] & ((ww >= 0) & (ww < w))[:, None, None, None, :]
    off = _pix_at(layout, np.clip(hh, 0, h - 1)[:, :, None], np.clip(ww, 0, w - 1)[:, None, :], cin, w)  # (PX,R,S)
    idx = c[None, :, :, None, None] * cs + off[:, None, None, :, :]
    xv = np.where(ok[None], x[:, idx], 0.0)                                      # (N, PX, KT, CG, R, S)
    widx = _filt(layout, layer, cg, k[:, None, None, None], cc[None, :, None, None], i[None, None, :, None],
                 j[None, None, None, :])
    assert widx.max() < wflat.size
    return np.einsum("nukcij,kcij->nuk", xv, wflat[widx])


def _produce(block: Block, g: Geometry, layout: str, xf: np.ndarray, x2f: np.ndarray, wf: list, bf: list, h: int,
             w: int, mp: int, mq: int, m0: int, n0: int) -> np.ndarray:
    """fused.cu produce: work item by work item, x and filters read from global memory."""
    n = xf.shape[0]
    p1s, p2s, _, _ = block.slots()
    cins = block.layer_inputs()
    mid = np.full((n, g.km * g.mplane), np.nan)
    l1, l2 = block.layers[p1s], (block.layers[p2s] if p2s is not None else None)
    px, kt = g.producer
    for k0, _, pix in _items(g.mplane, g.km, px, kt):
        pc = np.array([v if v >= 0 else 0 for v in pix])
        mh, mw = pc // g.mw, pc % g.mw
        m, qq = m0 + mh, n0 + mw
        inside = (m >= 0) & (m < mp) & (qq >= 0) & (qq < mq)
        acc = _reduce_global(layout, l1, cins[p1s], xf, h, w, m * l1.stride[0] - l1.pad[0],
                             qq * l1.stride[1] - l1.pad[1], wf[p1s], k0, kt)
        b1 = bf[p1s][k0:k0 + kt] if bf[p1s] is not None else 0.0
        if l2 is None:
            v = activate(acc + b1, l1.activation)
        else:
            acc2 = _reduce_global(layout, l2, cins[p2s], x2f, h, w, m * l2.stride[0] - l2.pad[0],
                                  qq * l2.stride[1] - l2.pad[1], wf[p2s], k0, kt)
            b2 = bf[p2s][k0:k0 + kt] if bf[p2s] is not None else 0.0
            v = activate(activate(acc + b1, l1.activation) + activate(acc2 + b2, l2.activation), _merge_act(block))
        for u, pv in enumerate(pix):
            if pv < 0:
                continue
            dst = (k0 + np.arange(kt)) * g.mplane + pv
            assert np.isnan(mid[0, dst]).all(), "an intermediate entry produced twice"
            mid[:, dst] = v[:, u, :] if inside[u] else 0.0
    return mid


def _pipe_stage(block: Block, g: Geometry, layout: str, c0: int, xs: list, ws: list, h: int, w: int, m0: int,
                n0: int) -> np.ndarray:
    """One buffer of fused.cu produce_pipelined's fetch/land for the chunk of input channels from ``c0``: x of each
    producer over the halo region (zero outside the input plane and past its channels) at (pr * PCC + cc) * MPLANE
    + position, then the filters transposed at XBUF + (pr * PCC + cc) * KMP + k.  Unwritten entries are NaN."""
    cc_n, npix, km = g.pcc, g.mplane, g.km
    xe = g.nprod * cc_n * npix
    count = xe + g.nprod * cc_n * km
    n = xs[0].shape[0]
    buf = np.full((n, g.xbuf + g.wbuf), np.nan)
    e = np.arange(count)
    ex, ew = e[e < xe], e[e >= xe] - xe
    pr, r = ex // (cc_n * npix), ex % (cc_n * npix)
    cc, pp = r // npix, r % npix
    mh, mw = pp // g.mw, pp % g.mw
    dst = (pr * cc_n + cc) * npix + pp
    vals = np.zeros((n, len(ex)))
    for k, slot in enumerate(s for s in block.slots()[:2] if s is not None):
        layer, cin = block.layers[slot], block.layer_inputs()[slot]
        sel = pr == k
        c = c0 + cc[sel]
        hh = (m0 + mh[sel]) * layer.stride[0] - layer.pad[0]
        ww = (n0 + mw[sel]) * layer.stride[1] - layer.pad[1]
        ok = (c < cin) & (hh >= 0) & (hh < h) & (ww >= 0) & (ww < w)
        cs = 1 if layout == "NHWC" else h * w
        idx = np.where(ok, c * cs + _pix_at(layout, np.clip(hh, 0, h - 1), np.clip(ww, 0, w - 1), cin, w), 0)
        vals[:, sel] = np.where(ok[None], xs[k][:, idx], 0.0)
    buf[:, dst] = vals
    pr, r = ew // (cc_n * km), ew % (cc_n * km)
    kk, cc = r // cc_n, r % cc_n
    dstw = g.xbuf + (pr * cc_n + cc) * g.kmp + kk
    for k, slot in enumerate(s for s in block.slots()[:2] if s is not None):
        cin = block.layer_inputs()[slot]
        sel = pr == k
        c = c0 + cc[sel]
        buf[:, dstw[sel]] = np.where(c < cin, ws[k][kk[sel] * cin + np.minimum(c, cin - 1)], 0.0)[None]
    assert len(np.unique(np.concatenate([dst, dstw]))) == count, "two elements land on one shared offset"
    return buf


def _produce_pipelined(block: Block, g: Geometry, layout: str, xs: list, ws: list, bs: list, h: int, w: int, mp: int,
                       mq: int, m0: int, n0: int) -> np.ndarray:
    """fused.cu produce_pipelined: one work item per thread, the reduction over chunks of PCC input channels read
    back from the staged buffer (:func:`_pipe_stage`) at the kernel's offsets."""
    px, kt = g.producer
    items = _items(g.mplane, g.km, px, kt)
    assert len(items) <= 512, "one producer item per thread"
    slots = [s for s in block.slots()[:2] if s is not None]
    layers = [block.layers[s] for s in slots]
    cmax = max(block.layer_inputs()[s] for s in slots)
    n = xs[0].shape[0]
    acc = np.zeros((len(slots), n, len(items), px, kt))
    vw = 4 if kt % 4 == 0 else 2 if kt % 2 == 0 else 1
    for c0 in range(0, cmax, g.pcc):
        buf = _pipe_stage(block, g, layout, c0, xs, ws, h, w, m0, n0)
        for i, (k0, _, pix) in enumerate(items):
            pc = np.array([v if v >= 0 else 0 for v in pix])
            for pr in range(len(slots)):
                rows = (pr * g.pcc + np.arange(g.pcc))
                xv = buf[:, rows[None, :] * g.mplane + pc[:, None]]                   # (N, PX, CC)
                wbase = g.xbuf + rows * g.kmp + k0
                assert (wbase % vw == 0).all(), "a filter vector load is misaligned"
                wv = buf[:, wbase[:, None] + np.arange(kt)[None, :]]                 # (N, CC, KT)
                acc[pr, :, i] += np.einsum("nuc,nck->nuk", xv, wv)
    mid = np.full((n, g.km * g.mplane), np.nan)
    for i, (k0, _, pix) in enumerate(items):
        b1 = bs[0][k0:k0 + kt] if bs[0] is not None else 0.0
        if len(slots) == 1:
            v = activate(acc[0, :, i] + b1, layers[0].activation)
        else:
            b2 = bs[1][k0:k0 + kt] if bs[1] is not None else 0.0
            v = activate(activate(acc[0, :, i] + b1, layers[0].activation)
                         + activate(acc[1, :, i] + b2, layers[1].activation), _merge_act(block))
        for u, pv in enumerate(pix):
            if pv < 0:
                continue
            mh, mw = divmod(pv, g.mw)
            inside = 0 <= m0 + mh < mp and 0 <= n0 + mw < mq
            dst = (k0 + np.arange(kt)) * g.mplane + pv
            assert np.isnan(mid[0, dst]).all(), "an intermediate entry produced twice"
            mid[:, dst] = v[:, u, :] if inside else 0.0
    return mid


def emulate(block: Block, t: Tiling, x: np.ndarray, weights: Sequence[np.ndarray],
            biases: Sequence[np.ndarray | None], x2: np.ndarray | None = None, layout: str = "NCHW") -> np.ndarray:
    """``block`` computed the way fused.cu does, in float64: thread block by thread block (tile, channel slice),
    work item by work item (:func:`stage_work`'s register tiles), the intermediate produced over
    :func:`halo_window` into a per-block array and read back at the consumers' offsets (a read outside the halo
    region raises; unproduced entries are NaN), filters read at the kernel's offsets in ``layout``'s filter format
    (staged consumers through the transposed copy :func:`stage_order` builds).  Every output element must be written
    exactly once (else AssertionError).  The CPU tests compare it with :func:`reference`."""
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[1:3]
    g = geometry(block, t)
    (mp, mq), (p, q) = block.planes(h, w)
    xf = x.reshape(n, -1)
    x2f = xf if x2 is None else np.asarray(x2, np.float64).reshape(n, -1)
    wf = [np.asarray(a, np.float64).reshape(-1) for a in weights]
    bf = [None if (b is None or not l.bias) else np.asarray(b, np.float64) for b, l in zip(biases, block.layers)]
    p1s, p2s, c1s, c2s = block.slots()
    cins = block.layer_inputs()
    y = np.full((n, g.ky * p * q), np.nan)
    written = np.zeros(g.ky * p * q, dtype=int)
    tp, tq = tiles(block, t, h, w)
    for bx in range(tp * tq):
        p0, q0 = tile_origin(bx, block, t, h, w)
        m0, n0, _, _ = halo_window(block, t, p0, q0)
        for s in range(t.ks):
            # 1. staged filters
            ws = {}
            for slot, ksl, on in ((c1s, g.k1s, g.ws1), (c2s, g.k2s, g.ws2)):
                if slot is None or not on:
                    continue
                layer, cin = block.layers[slot], cins[slot]
                dst, src = stage_order(layer, cin, ksl, layout)
                cgrs = (cin // layer.groups) * layer.kernel[0] * layer.kernel[1]
                buf = np.full(cgrs * ksl, np.nan)
                assert np.bincount(dst, minlength=buf.size).max() == 1 and len(dst) == buf.size
                buf[dst] = wf[slot][s * ksl * cgrs + src]
                ws[slot] = buf
            # 2. the intermediate over the halo region
            if g.pcc:
                pws = [wf[p1s]] + ([wf[p2s]] if p2s is not None else [])
                pbs = [bf[p1s]] + ([bf[p2s]] if p2s is not None else [])
                mid = _produce_pipelined(block, g, layout, [xf, x2f], pws, pbs, h, w, mp, mq, m0, n0)
            else:
                mid = _produce(block, g, layout, xf, x2f, wf, bf, h, w, mp, mq, m0, n0)
            assert not np.isnan(mid).any(), "the halo region is not fully produced"
            # 3. consumers
            for slot, (cpx, ckt), ksl, off, coff in ((c1s, g.consumer1, g.k1s, g.off1, 0),
                                                      (c2s, g.consumer2, g.k2s, g.off2,
                                                       block.layers[c1s].out_channels)):
                if slot is None:
                    continue
                layer, cin = block.layers[slot], cins[slot]
                cg, kg = cin // layer.groups, layer.out_channels // layer.groups
                r_, s_ = layer.kernel
                sh, sw = layer.stride
                ks0 = s * ksl
                cc, i, j = np.arange(cg), np.arange(r_), np.arange(s_)
                for kk0, _, pix in _items(t.th * t.tw, ksl, cpx, ckt):
                    k = ks0 + kk0 + np.arange(ckt)
                    pc = np.array([v if v >= 0 else 0 for v in pix])
                    oh, ow = pc // t.tw, pc % t.tw
                    ok = (np.array(pix) >= 0) & (p0 + oh < p) & (q0 + ow < q)
                    rows = (oh * sh + off[0])[:, None] + i[None, :]
                    cols = (ow * sw + off[1])[:, None] + j[None, :]
                    assert rows.max() < g.mh and cols.max() < g.mw, "a consumer read past the halo region"
                    base = (oh * sh + off[0]) * g.mw + ow * sw + off[1]
                    c = (k[:, None] // kg) * cg + cc[None, :]
                    midx = (c[None, :, :, None, None] * g.mplane + base[:, None, None, None, None]
                            + i[None, None, None, :, None] * g.mw + j[None, None, None, None, :])
                    xv = mid[:, midx]                                            # (N, PX, KT, CG, R, S)
                    if slot in ws:
                        assert kg % ckt == 0, "a staged consumer's register tile straddles two groups"
                        tap = cc[None, :, None, None] * r_ * s_ + i[None, None, :, None] * s_ + j[None, None, None, :]
                        widx = tap * ksl + (kk0 + np.arange(ckt))[:, None, None, None]
                        wv = ws[slot][widx]
                    else:
                        wv = wf[slot][_filt(layout, layer, cg, k[:, None, None, None], cc[None, :, None, None],
                                            i[None, None, :, None], j[None, None, None, :])]
                    acc = np.einsum("nukcij,kcij->nuk", xv, wv)
                    bb = bf[slot][k] if bf[slot] is not None else 0.0
                    v = activate(acc + bb, layer.activation)
                    for u in range(cpx):
                        if not ok[u]:
                            continue
                        pp, qq = p0 + oh[u], q0 + ow[u]
                        ch = coff + k
                        o = (pp * q + qq) * g.ky + ch if layout == "NHWC" else (ch * p + pp) * q + qq
                        y[:, o] = v[:, u, :]
                        written[o] += 1
    assert (written == 1).all(), "every output element is written exactly once"
    shape = block.y_shape(n, h, w, layout)
    return y.reshape(shape)
