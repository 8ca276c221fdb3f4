"""NumPy's space-to-depth fold: the reference for ucudnn's fold kernels (test_gpu_fold.py) and for the folded
problem's geometry (test_fold.py)."""
from __future__ import annotations

import numpy as np


def nchw_fold(t: np.ndarray, g) -> np.ndarray:
    """Fold an NCHW tensor by ``g`` (a :class:`ucudnn.kernels.fold.FoldGeometry`): cf = (i*sw + j)*c + ch."""
    (sh, sw), (ph, pw), (hb, wb) = g.stride, g.pad, g.folded_hw
    n = t.shape[0]
    big = np.zeros((n, g.c, hb * sh, wb * sw), t.dtype)
    rows, cols = min(g.h, hb * sh - ph), min(g.w, wb * sw - pw)
    big[:, :, ph:ph + rows, pw:pw + cols] = t[:, :, :rows, :cols]
    return big.reshape(n, g.c, hb, sh, wb, sw).transpose(0, 3, 5, 1, 2, 4).reshape(n, g.cf, hb, wb)
