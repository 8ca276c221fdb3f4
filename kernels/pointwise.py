"""Fused chains of 1x1 convolutions on tensor cores (``pointwise.cu``): seed 004's straight and merge blocks whose
layers are all 1x1, stride 1, unpadded and ungrouped, in FP16 with FP32 accumulation.

Why a second fused kernel: :mod:`kernels.fused` computes in float32 FMA; in FP16 cuDNN's per-layer 1x1 kernels use
tensor cores and beat it on the seed's ResNet block c.1 (H100, batch 1: 28.3 vs 23.2 us).  A chain of 1x1
convolutions is a chain of GEMMs over the pixels, which is what ``mma.sync`` does; the intermediate activation stays
in shared memory (as FP16, what a per-layer FP16 network stores between layers too).

    launch = launcher(SEED_BLOCKS["c.1"], "float16", "NCHW", x.shape)          # compiles once (NVRTC)
    launch(x, weights, biases, out)                                            # the fused.launcher signature

The launcher's tiling is (``pt`` pixels per thread block, ``nw`` warps); :func:`kernels.blocks.tuned` times the
candidates (:data:`TILINGS`) on the operands.  :func:`emulate` is the kernel's arithmetic in NumPy (FP16 rounding of
the intermediate and the output, FP32 sums), used by the CPU tests.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ucudnn.errors import InputError

from . import _compile
from .fused import Block, Launch, _check, layer_ptrs, smem_limit

SOURCE = "pointwise.cu"
LAYOUTS = ("NCHW", "NHWC")
#: (pixels per thread block, warps) tried by :func:`kernels.blocks.tuned`, the first being the default.
TILINGS: tuple[tuple[int, int], ...] = ((32, 4), (16, 4), (64, 4), (64, 8), (128, 8))
_MAX_Z = 65535
_ACT_ENUM = {"none": "ACT_NONE", "relu": "ACT_RELU", "relu6": "ACT_RELU6"}


def unsupported(block: Block, dtype: str) -> str | None:
    """Why the tensor-core kernel cannot run ``block`` in ``dtype`` (None: it can)."""
    if dtype != "float16":
        return "tensor-core chains run float16 data"
    if block.mode not in ("straight", "merge"):
        return f"a {block.mode} block is not a chain"
    for i, (layer, cin) in enumerate(zip(block.layers, block.layer_inputs())):
        if layer.kernel != (1, 1) or layer.stride != (1, 1) or layer.pad != (0, 0) or layer.groups != 1:
            return f"layer {i} is not a 1x1, stride-1, unpadded, ungrouped convolution"
        if layer.out_channels % 16 or cin % 16:
            return f"layer {i}'s channels ({cin} -> {layer.out_channels}) are not multiples of 16"
    return None


def _layers(block: Block) -> tuple[Any, Any, Any]:
    """(first producer, second producer or None, consumer) in the kernel's slots."""
    if block.mode == "straight":
        return block.layers[0], None, block.layers[1]
    return block.layers[0], block.layers[1], block.layers[2]


def smem_bytes(block: Block, pt: int) -> int:
    c, m = block.in_channels, block.mid_channels
    return 2 * (pt * (c + 8) * (2 if block.mode == "merge" else 1) + pt * (m + 8))


def fitting(block: Block, limit: int) -> list[tuple[int, int]]:
    """The tilings of :data:`TILINGS` whose shared memory fits ``limit`` bytes, in order."""
    return [(pt, nw) for pt, nw in TILINGS if smem_bytes(block, pt) <= limit]


def name_expr(block: Block, layout: str, pt: int, nw: int) -> str:
    l1, l2, l3 = _layers(block)
    b = lambda v: "true" if v else "false"  # noqa: E731
    a = lambda layer: _ACT_ENUM[layer.activation] if layer is not None else "ACT_NONE"  # noqa: E731
    mode = 1 if block.mode == "merge" else 0
    return (f"pointwise_chain<{mode},{block.in_channels},{block.mid_channels},{l3.out_channels},"
            f"{b(layout == 'NHWC')},{pt},{nw},{b(l1.bias)},{a(l1)},{b(l2 is not None and l2.bias)},{a(l2)},"
            f"{b(block.merge_relu)},{b(l3.bias)},{a(l3)}>")


def launcher(block: Block, dtype: str, layout: str, x_shape: Sequence[int], pt: int = TILINGS[0][0],
             nw: int = TILINGS[0][1]) -> Launch:
    """``launch(x, weights, biases, out, x2=None)`` on CuPy arrays, as :func:`kernels.fused.launcher`'s; runs on
    CuPy's current stream, allocates nothing, capturable in a CUDA graph.  InputError if the block is not a chain
    this kernel runs (:func:`unsupported`)."""
    why = unsupported(block, dtype)
    if why is not None:
        raise InputError(why, "block")
    if layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {layout!r}", "layout")
    if pt not in (8, 16, 32, 64, 128) or nw not in (1, 2, 4, 8, 16):
        raise InputError(f"expected pt in 8..128 (a power of two) and nw in 1..16, got {pt}, {nw}", "tiling")
    x_shape = tuple(int(v) for v in x_shape)
    n, h, w = (x_shape[0], x_shape[2], x_shape[3]) if layout == "NCHW" else x_shape[:3]
    want_x = block.x_shape(n, h, w, layout)
    if x_shape != want_x:
        raise InputError(f"expected an input of shape {want_x}, got {x_shape}", "x")
    npix = h * w
    if max(block.in_channels, block.mid_channels, block.out_channels) * npix >= 2 ** 31:
        raise InputError("a sample of 2**31 elements or more", "x")
    smem = smem_bytes(block, pt)
    limit = smem_limit()
    if smem > limit:
        raise InputError(f"pt={pt} needs {smem} bytes of shared memory, the device allows {limit}", "tiling")
    kernel = _compile.get_kernel(SOURCE, name_expr(block, layout, pt, nw))
    if smem > 48 << 10:
        kernel.max_dynamic_shared_size_bytes = smem
    y_shape = block.y_shape(n, h, w, layout)
    w_shapes = block.weight_shapes(layout)
    slots = {"straight": (0, None, 1), "merge": (0, 1, 2)}[block.mode]
    merge = block.mode == "merge"
    grid_x = -(-npix // pt)
    per_x, per_y = block.in_channels * npix * 2, block.out_channels * npix * 2
    parts = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]
    p32 = np.int32(npix)

    def launch(x: Any, weights: Sequence[Any], biases: Sequence[Any], out: Any, x2: Any = None) -> None:
        xp = _check(x, "x", want_x, dtype, 16)
        x2p = _check(x2, "x2", want_x, dtype, 16) if (merge and x2 is not None) else xp
        wp, bp = layer_ptrs(block, weights, biases, w_shapes, dtype, [4] * len(block.layers))
        ptrs = []
        for s in slots:
            ptrs += [0, 0] if s is None else [wp[s], bp[s]]
        yp = _check(out, "out", y_shape, dtype)
        for n0, cnt in parts:
            kernel((grid_x, 1, cnt), (32 * nw,), (xp + n0 * per_x, x2p + n0 * per_x, *ptrs, yp + n0 * per_y, p32),
                   shared_mem=smem)

    return launch


# ---- the kernel's arithmetic in NumPy -------------------------------------------------------------------------------
def _act(v: np.ndarray, name: str) -> np.ndarray:
    if name == "relu":
        return np.maximum(v, 0)
    if name == "relu6":
        return np.minimum(np.maximum(v, 0), 6)
    return v


def emulate(block: Block, x: np.ndarray, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None],
            x2: np.ndarray | None = None, layout: str = "NCHW") -> np.ndarray:
    """What the kernel computes, in NumPy: float32 sums of float16 operands, the intermediate (after bias,
    activations, the add and MRELU) rounded to float16, the output rounded to float16.  Arrays in ``layout``,
    float16."""
    why = unsupported(block, "float16")
    if why is not None:
        raise InputError(why, "block")
    l1, l2, l3 = _layers(block)
    s1, s2, s3 = {"straight": (0, None, 1), "merge": (0, 1, 2)}[block.mode]

    def pix(a: np.ndarray) -> np.ndarray:      # [n, pixels, c] float32
        a = np.asarray(a, np.float16).astype(np.float32)
        return a.transpose(0, 2, 3, 1).reshape(a.shape[0], -1, a.shape[1]) if layout == "NCHW" else \
            a.reshape(a.shape[0], -1, a.shape[3])

    def mat(wt: np.ndarray) -> np.ndarray:     # [k, c] float32
        return np.asarray(wt, np.float16).astype(np.float32).reshape(wt.shape[0], -1)

    def bias(i: int | None, layer: Any) -> np.ndarray | float:
        return np.asarray(biases[i], np.float16).astype(np.float32) if layer is not None and layer.bias else 0.0

    xs = pix(x)
    mid = _act(xs @ mat(weights[s1]).T + bias(s1, l1), l1.activation)
    if block.mode == "merge":
        mid = mid + _act(pix(x if x2 is None else x2) @ mat(weights[s2]).T + bias(s2, l2), l2.activation)
        if block.merge_relu:
            mid = np.maximum(mid, 0)
    mid = mid.astype(np.float16).astype(np.float32)
    y = _act(mid @ mat(weights[s3]).T + bias(s3, l3), l3.activation).astype(np.float16)
    n = x.shape[0]
    h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[1:3]
    y = y.reshape(n, h, w, -1)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2)) if layout == "NCHW" else y


__all__ = ["unsupported", "launcher", "emulate", "fitting", "TILINGS"]
