"""Legacy transform-domain configurations run through their graph-API twins and compute what the legacy call does
(GPU; skipped without one).

A twin (``legacy_engines.TWIN_ENGINES``, ``GraphSource.twin``) is the engine cuDNN 9 itself runs the legacy
algorithm as, built once: the same kernels, less host work a call.  Each case runs every twinned algorithm the
problem supports three ways -- the legacy call, the twin (alpha 1, beta 0), and the twinned launcher accumulating
(beta 1, which stays with the legacy call) -- on awkward shapes (odd batches, C = 3, non-square and
one-dimensional filters).
"""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

PROBLEMS = {
    "5x5-odd-batch": ConvProblem(7, 24, 27, 27, 40, 5, 5, pad=(2, 2)),
    "7x1": ConvProblem(5, 16, 12, 12, 24, 7, 1, pad=(3, 0)),
    "3x3-c3-non-square": ConvProblem(3, 3, 33, 17, 8, 3, 3, pad=(1, 1)),
    "1x7-large": ConvProblem(2, 32, 64, 64, 32, 1, 7, pad=(0, 3)),
}
OPS = ("forward", "backward_data", "backward_filter")


def _supported(op, p):
    """(algo, workspace bytes) of each twinned legacy algorithm cuDNN supports for ``p`` under FMA math."""
    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle
    from ucudnn.errors import CudnnError
    from ucudnn.legacy_engines import TWIN_ENGINES

    d = descriptors(p, "FMA")
    a, b, out = d.operands(op)
    found = []
    for (o, algo) in TWIN_ENGINES:
        if o != op:
            continue
        try:
            found.append((algo, cudnn.get_workspace_size(handle(), op, a, b, d.conv, out, algo)))
        except CudnnError:
            continue
    return [(a, ws) for a, ws in found if ws <= 1 << 30]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_each_twinned_algorithm_computes_what_its_legacy_call_computes(name, op):
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.legacy import LegacySource
    from ucudnn.planning.table import Measurement

    p = PROBLEMS[name]
    buf = Buffers(p)
    ops = buf.operands(op, p.n)
    out = buf.arrays(op)[2]
    src = LegacySource()
    checked = 0
    for algo, ws_bytes in _supported(op, p):
        ws = cp.cuda.alloc(max(ws_bytes, 1))
        cfg = Measurement(p.n, algo, "FMA", 1.0, ws_bytes, extra={"deterministic": True})
        plain = src.prepare(op, p, cfg, twin=False)
        twinned = src.prepare(op, p, cfg)
        plain(ops, ws.ptr, ws_bytes, 1.0, 0.0)
        want = cp.asnumpy(out).astype(np.float64)
        out.fill(np.nan)
        twinned(ops, ws.ptr, ws_bytes, 1.0, 0.0)
        got = cp.asnumpy(out).astype(np.float64)
        scale = max(np.abs(want).max(), 1e-30)
        assert np.isfinite(got).all(), f"{op} algo {algo}: the twin left output unwritten"
        assert np.abs(got - want).max() / scale < 1e-6, f"{op} algo {algo} (twin: {getattr(twinned, 'twin', None)})"
        twinned(ops, ws.ptr, ws_bytes, 1.0, 1.0)        # accumulate: the legacy call's beta
        np.testing.assert_allclose(cp.asnumpy(out), 2 * want, rtol=1e-5, atol=1e-5 * scale)
        checked += 1
    if not checked:
        pytest.skip(f"cuDNN supports no twinned algorithm for {op} on {name}")


def test_the_5x5_transform_domain_algorithms_find_their_twins():
    """Not a silent no-op: on a 5x5 stride-1 problem cuDNN 9 supports FFT_TILING / WINOGRAD_NONFUSED for each op,
    and the engine cuDNN runs them as is found (the same workspace) for at least one algorithm of each op."""
    from ucudnn.binding import cudnn
    from ucudnn.measure.sources.legacy import twin_of
    from ucudnn.planning.table import Measurement

    if cudnn.get_version() < 90000:
        pytest.skip("the twin table is cuDNN 9's")
    from ucudnn.measure.sources.graph import GraphUnavailable, frontend

    try:
        frontend()
    except GraphUnavailable as e:
        pytest.skip(f"twins are built through the graph API: {e}")
    p = PROBLEMS["5x5-odd-batch"]
    for op in OPS:
        twins = [algo for algo, ws in _supported(op, p)
                 if twin_of(op, p, Measurement(p.n, algo, "FMA", 1.0, ws, extra={"deterministic": True}))]
        assert twins, f"no twin found for {op} among {_supported(op, p)}"
