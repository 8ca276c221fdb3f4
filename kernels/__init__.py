"""ucudnn.kernels: ucudnn's own memory-bound CUDA kernels (sources beside this file) and their launchers.

Installed as ``ucudnn.kernels``.  Launchers take and return CuPy arrays and
compile their kernels at first use (NVRTC, cached); importing this package
needs no GPU and does not import CuPy.

- :func:`transform_layout` -- NCHW / CHWN / NHWC, any pair (layout.py, layout.cu)
- :func:`softmax_forward`, :func:`softmax_backward` -- fused, along any axis (softmax.py, softmax.cu)
- :func:`pool2d_forward`, :func:`pool2d_backward` -- max / average, NCHW and CHWN, auto-tuned
  thread coarsening (pooling.py, pooling.cu, autotune.py)
- :func:`ucudnn.kernels.fold.launchers` -- space-to-depth folding of a strided convolution's operands, on raw
  pointers, for the fold algorithm source (fold.py, fold.cu)
- :func:`fused_forward` -- consecutive convolution layers of a block (straight, split, merge; seed 004) in one
  kernel, intermediates in shared memory (fused.py, fused.cu); :data:`ucudnn.kernels.fused.SEED_BLOCKS`; in FP16
  also on tensor cores: chains of 1x1s (pointwise.py, pointwise.cu) and a 1x1 followed by R x S convolutions
  (spatial.py, spatial.cu); :mod:`ucudnn.kernels.blocks` names the kernels that run a block and launches any of them
- mec (seed 002), direct (seed 001), winograd: the algorithm sources' kernels (mec.py; direct.py, direct_dw.py,
  direct_plane.py and igemm.py; winograd.py)
"""
from .fused import fused_forward
from .layout import transform_layout
from .pooling import pool2d_backward, pool2d_forward
from .softmax import softmax_backward, softmax_forward

__all__ = ["transform_layout", "softmax_forward", "softmax_backward", "pool2d_forward", "pool2d_backward",
           "fused_forward"]
