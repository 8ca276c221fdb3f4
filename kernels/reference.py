"""Float64 NumPy reference of a 2-D convolution, the one the kernels' and the plans' checks share.

``conv2d_nchw`` is the definition every ucudnn convolution is checked against (direct's forward, each layer of a
fused block, each conv node of an inference plan): cross-correlation over zero-padded input, any stride,
dilation and groups, in NCHW with filters [K, C/G, R, S].  Layout conversion, bias and activation stay with the
callers, which know their conventions.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def conv2d_nchw(x: np.ndarray, w: np.ndarray, pad: Sequence[int] = (0, 0), stride: Sequence[int] = (1, 1),
                dilation: Sequence[int] = (1, 1), groups: int = 1) -> np.ndarray:
    """y[n, k, p, q] = sum over c, i, j of x_padded[n, g*C/G + c, p*sh + i*dh, q*sw + j*dw] * w[k, c, i, j]
    (g the group of k), in float64."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (ph, pw), (sh, sw), (dh, dw) = pad, stride, dilation
    p, q = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (s - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, k, p, q))
    kg = k // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(r):
            for j in range(s):
                patch = xs[:, :, i * dh:i * dh + sh * (p - 1) + 1:sh, j * dw:j * dw + sw * (q - 1) + 1:sw]
                y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, w[g * kg:(g + 1) * kg, :, i, j])
    return y
