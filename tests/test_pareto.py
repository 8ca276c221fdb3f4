"""Desirable sets (seed 003, section 3.3.1): exactly the Pareto front of all configurations."""
from __future__ import annotations

import synthetic
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.planning import wr
from ucudnn.planning.pareto import Configuration, desirable_set, desirable_sets, fastest_within, pareto
from ucudnn.planning.table import KernelBench
from ucudnn.policy import micro_batch_sizes


def all_configurations(kernel: KernelBench, batch_policy: str) -> list[tuple[float, int]]:
    """(time, workspace) of every multiset of allowed micro-configurations summing to B: brute force."""
    allowed = set(micro_batch_sizes(batch_policy, kernel.problem.n))
    opts = sorted((m for m in kernel.measurements if m.micro_batch in allowed),
                  key=lambda m: (m.micro_batch, m.time_ms, m.workspace_bytes, str(m.algo)))
    out: list[tuple[float, int]] = []

    def extend(start: int, left: int, time: float, ws: int) -> None:
        if left == 0:
            out.append((time, ws))
            return
        for i in range(start, len(opts)):  # non-decreasing index: each multiset once
            m = opts[i]
            if m.micro_batch <= left:
                extend(i, left - m.micro_batch, time + m.time_ms, max(ws, m.workspace_bytes))

    extend(0, kernel.problem.n, 0.0, 0)
    return out


@st.composite
def small_kernels(draw):
    """B <= 8, up to three options per allowed size (some sizes unsupported), integer times: exact sums."""
    batch = draw(st.integers(1, 8))
    policy = draw(st.sampled_from(["all", "powerOfTwo", "undivided"]))
    options = {}
    for b in micro_batch_sizes(policy, batch):
        options[b] = draw(st.lists(st.tuples(st.integers(1, 30).map(float), st.sampled_from([0, 100, 200, 300, 500, 800])),
                                   max_size=3))
    return synthetic.from_options(batch, options), policy


@settings(max_examples=300, deadline=None)
@given(small_kernels())
def test_desirable_set_equals_the_pareto_front_of_exhaustive_enumeration(case):
    kernel, policy = case
    front = pareto(all_configurations(kernel, policy), lambda x: x[0], lambda x: x[1])
    got = [(c.time_ms, c.workspace_bytes) for c in desirable_set(kernel, policy)]
    assert got == front


@settings(max_examples=200, deadline=None)
@given(small_kernels(), st.sampled_from([0, 100, 250, 500, 10_000]))
def test_wr_optimum_at_a_limit_is_the_fastest_desirable_configuration_within_it(case, limit):
    kernel, policy = case
    sizes = micro_batch_sizes(policy, kernel.problem.n)
    best = wr.solve(kernel.problem.n, wr.fastest_per_size(kernel.measurements, sizes, limit))
    chosen = fastest_within(desirable_set(kernel, policy), limit)
    if best is None:
        assert chosen is None
    else:
        assert chosen is not None and chosen.time_ms == sum(m.time_ms for m in best)


def test_desirable_configurations_cover_the_mini_batch_with_allowed_sizes_only():
    k = synthetic.kernel("conv/forward", 48, seed=7, policy="powerOfTwo")
    configs = desirable_set(k, "powerOfTwo")
    assert configs
    allowed = set(micro_batch_sizes("powerOfTwo", 48))
    for c in configs:
        assert c.batch == 48
        assert {m.micro_batch for m in c.micro} <= allowed


def test_desirable_set_is_ordered_by_workspace_with_strictly_falling_time():
    configs = desirable_set(synthetic.kernel("conv/forward", 64, seed=3), "all")
    assert len(configs) > 2
    for a, b in zip(configs, configs[1:]):
        assert a.workspace_bytes < b.workspace_bytes and a.time_ms > b.time_ms


def test_splitting_wins_when_only_a_small_micro_batch_fits_a_fast_algorithm():
    # B=4: undivided only has a slow zero-workspace algorithm; micro-batches of 2 can use a fast one
    k = synthetic.from_options(4, {4: [(10.0, 0), (3.0, 400)], 2: [(2.0, 200)], 1: [(4.0, 0)]})
    assert [(c.time_ms, c.workspace_bytes, c.summary()) for c in desirable_set(k, "powerOfTwo")] == [
        (10.0, 0, "4 a0/FMA"), (4.0, 200, "2x2 a0/FMA"), (3.0, 400, "4 a1/FMA")]


def test_a_cap_keeps_exactly_the_configurations_within_it():
    k = synthetic.kernel("conv/forward", 32, seed=11)
    full = desirable_set(k, "all")
    cap = full[len(full) // 2].workspace_bytes
    assert desirable_set(k, "all", max_workspace=cap) == [c for c in full if c.workspace_bytes <= cap]


def test_no_usable_measurement_means_no_configuration():
    k = synthetic.from_options(6, {6: [], 4: [(1.0, 0)]})  # 4 alone cannot make 6 under powerOfTwo
    assert desirable_set(k, "powerOfTwo") == []
    assert fastest_within([], 1 << 30) is None


def test_repeated_kernels_share_one_desirable_set():
    t = synthetic.table(n_kernels=2, batch=16, repeats=3)
    sets = desirable_sets(t, "all")
    assert sets["conv0/forward"] is sets["conv0_1/forward"] is sets["conv0_2/forward"]
    assert sets["conv0/forward"] is not sets["conv1/forward"]


def test_configuration_time_adds_and_workspace_takes_the_max():
    k = synthetic.from_options(3, {2: [(2.0, 300)], 1: [(1.5, 700)]})
    c = Configuration(tuple(k.measurements))
    assert (c.time_ms, c.workspace_bytes, c.batch) == (3.5, 700, 3)
