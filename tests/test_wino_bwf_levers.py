"""benchmarks/wino_bwf_levers.py's fixed inputs: the configurations it calls the 64 MiB and unbounded plans' are
what those limits allow (so its split-GEMM rows compare what WR would run)."""
from __future__ import annotations

import pytest

from bench_scripts import load
from ucudnn.kernels.winograd import Geometry

MiB = 1 << 20
levers = load("wino_bwf_levers")


@pytest.mark.parametrize("name", sorted(levers.PLANNED))
def test_planned_configurations_fit_their_limits(name):
    (mb, tiles, streams), (ub_mb, ub_tiles, ub_streams) = levers.PLANNED[name]
    base = levers.problem(name)
    geo = Geometry.of(levers.problem(name, mb), "backward_filter")
    assert base.n % mb == 0 and ub_mb == base.n
    assert geo.workspace_bytes(0, tiles, 1, streams) <= 64 * MiB
    assert geo.workspace_bytes(0, ub_tiles, 1, ub_streams) > 64 * MiB
    # every chunk of both calls splits evenly in two (the S = 2 rows run for every layer)
    for n, t in ((mb, tiles), (ub_mb, ub_tiles)):
        assert all(count % 2 == 0 for _, count in geo.ranges(n, 0, t))
