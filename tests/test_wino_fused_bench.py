"""benchmarks/wino_fused.py (CPU): every layer it names is one the fused kernel runs, forward and backward data, with
U -- its whole workspace -- inside 64 MiB."""
from __future__ import annotations

from bench_scripts import load
from ucudnn.kernels.winograd import Geometry, fused_refusal, fused_workspace_bytes

from ucudnn.problem import ConvProblem


def test_every_named_layer_runs_fused_within_64_mib():
    layers = load("wino_fused").LAYERS
    assert len(layers) == 15
    for name, (n, c, hw, k) in layers.items():
        p = ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1))
        for op in ("forward", "backward_data"):
            geo = Geometry.of(p, op)
            assert fused_refusal(geo, n) is None, name
            assert fused_workspace_bytes(geo) <= 36 << 20, name   # 512 x 512 channels: 36 MiB
