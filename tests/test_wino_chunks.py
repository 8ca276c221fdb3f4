"""benchmarks/wino_chunks.py's choice of chunk sizes (CPU): from the most tiles that fit the limit, doubling, to the
whole call; every layer it names is one the winograd kernels run."""
from __future__ import annotations

from itertools import pairwise

from bench_scripts import load
from ucudnn.kernels.winograd import Geometry, refusal

from ucudnn.problem import ConvProblem

MiB = 1 << 20


def _geo(name: str) -> tuple[Geometry, int]:
    n, c, hw, k = load("wino_chunks").LAYERS[name]
    return Geometry.of(ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1)), "forward"), n


def test_chunks_start_at_the_largest_fitting_whole_rows_and_end_with_the_call():
    wc = load("wino_chunks")
    geo, n = _geo("vgg16-conv4_2")
    sizes = wc.chunk_tiles(geo, n, 64 * MiB)
    total = n * geo.tiles_per_image
    assert sizes[-1] == total and sizes == sorted(sizes)
    first = sizes[0]
    assert first % geo.tiles_w == 0 and geo.workspace_bytes(0, first) <= 64 * MiB
    assert geo.workspace_bytes(0, first + geo.tiles_w) > 64 * MiB      # the next row no longer fits
    assert all(b == 2 * a for a, b in pairwise(sizes[:-1]))
    assert wc.chunk_tiles(geo, n, 1 * MiB) == []                       # U alone is over 1 MiB


def test_every_named_layer_is_a_winograd_layer():
    wc = load("wino_chunks")
    for name, (n, c, hw, k) in wc.LAYERS.items():
        assert refusal(ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1)), "forward") is None, name
