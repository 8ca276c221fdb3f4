"""The network files benchmarks run on (``benchmarks/networks/*.json``, passed to ``--network`` by path) are valid
``ucudnn-network/1`` documents whose layers give kernels, and the large-filter set is what the fft source takes."""
from __future__ import annotations

from pathlib import Path

import pytest

from ucudnn.kernels.fft import refusal
from ucudnn.planning.network import load_network

ROOT = Path(__file__).resolve().parent.parent / "benchmarks" / "networks"


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.json")), ids=lambda p: p.name)
def test_benchmark_network_files_load(path):
    net = load_network(path)
    assert net.name == path.stem
    kernels = net.kernels(3, "float32", "NCHW")
    assert kernels and {k.op for k in kernels} == {"forward", "backward_data", "backward_filter"}


def test_large_filter_layers_are_all_taken_by_the_fft_source():
    for k in load_network(ROOT / "large_filters.json").kernels(64, "float32", "NCHW"):
        assert refusal(k.problem, k.op) is None, k.name
