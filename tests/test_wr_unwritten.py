"""WR with memory the call owns and has not written yet (issue 18): a micro-configuration may take its workspace
from the output of the images after it (forward, backward data) or from a fixed buffer (backward filter: the dx its
layer's backward data writes next).  Properties over random tables: the plan covers the batch, every configuration
fits what is unwritten when it runs, it is never slower than WR at the limit alone, and it is exact."""
from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ucudnn.planning.table import KernelBench, Measurement
from ucudnn.planning.wr import solve, solve_kernel, solve_with_unwritten, unwritten_bytes, unwritten_room
from ucudnn.problem import ConvProblem

MiB = 1 << 20


def _kernel(op: str, n: int, rows: list[tuple[int, float, int]]) -> KernelBench:
    problem = ConvProblem(n, 64, 56, 56, 64, 3, 3, pad=1)
    return KernelBench("conv", op, problem, [Measurement(b, a, "FMA", t, ws) for a, (b, t, ws) in enumerate(rows)])


@st.composite
def tables(draw):
    n = draw(st.integers(1, 8))
    rows = [(b, draw(st.floats(0.1, 10.0)), draw(st.integers(0, 12)) * MiB)
            for b in range(1, n + 1) for _ in range(draw(st.integers(0, 2)))]
    rows.append((1, 50.0, 0))          # a workspace-free configuration of one image: always a plan
    return n, rows


def _brute(n, rows, limit, per_image, fixed):
    """Every ordered sequence of configurations covering n images, checked against what is unwritten."""
    best = math.inf

    def walk(r, spent):
        nonlocal best
        if r == 0:
            best = min(best, spent)
            return
        for b, t, ws in rows:
            if b <= r and ws <= max(limit, fixed, (r - b) * per_image - 256):
                walk(r - b, spent + t)

    walk(n, 0.0)
    return best


@settings(max_examples=60, deadline=None)
@given(tables(), st.integers(0, 8), st.integers(0, 3), st.integers(0, 10))
def test_the_plan_covers_the_batch_fits_what_is_unwritten_and_is_optimal(table, limit_mib, per_image_mib, fixed_mib):
    n, rows = table
    k = _kernel("forward", n, rows)
    limit, per_image, fixed = limit_mib * MiB, per_image_mib * MiB, fixed_mib * MiB
    plan = solve_with_unwritten(k, range(1, n + 1), limit, per_image, fixed)
    assert plan is not None and sum(m.micro_batch for m in plan) == n
    remaining = n
    for m in plan:                                     # in the order they run
        remaining -= m.micro_batch
        assert m.workspace_bytes <= max(limit, unwritten_room(remaining, per_image, fixed))
    total = sum(m.time_ms for m in plan)
    assert math.isclose(total, _brute(n, rows, limit, per_image, fixed), rel_tol=1e-9)
    alone = solve_kernel(k, range(1, n + 1), limit)
    assert total <= sum(m.time_ms for m in alone) + 1e-9


@settings(max_examples=40, deadline=None)
@given(tables(), st.integers(0, 8))
def test_with_nothing_unwritten_it_is_wr_and_with_room_for_all_it_is_unbounded(table, limit_mib):
    n, rows = table
    k = _kernel("forward", n, rows)
    sizes = range(1, n + 1)
    plain = solve_with_unwritten(k, sizes, limit_mib * MiB)
    assert math.isclose(sum(m.time_ms for m in plain), sum(m.time_ms for m in solve_kernel(k, sizes, limit_mib * MiB)))
    roomy = solve_with_unwritten(k, sizes, limit_mib * MiB, fixed=1 << 40)
    assert math.isclose(sum(m.time_ms for m in roomy), sum(m.time_ms for m in solve(n, {
        b: min((m for m in k.measurements if m.micro_batch == b), key=lambda m: m.time_ms)
        for b in sizes if any(m.micro_batch == b for m in k.measurements)})))


def test_a_large_configuration_runs_first_where_the_later_images_output_holds_its_workspace():
    """8 images whose output is 2 MiB each: a 4-image configuration needing 7 MiB fits while 4 images are still to
    come (their 8 MiB of output, less the alignment's 256 bytes), so it runs first; the last 4 images run within
    the 1 MiB limit.  One needing all 8 MiB would not fit there."""
    rows = [(4, 1.0, 7 * MiB), (4, 3.0, 1 * MiB), (1, 1.0, 0)]
    k = _kernel("forward", 8, rows)
    plan = solve_with_unwritten(k, [1, 2, 4, 8], 1 * MiB, per_image=2 * MiB)
    assert [(m.micro_batch, m.workspace_bytes) for m in plan] == [(4, 7 * MiB), (4, 1 * MiB)]
    assert unwritten_room(4, 2 * MiB) == 8 * MiB - 256 and unwritten_room(0, 2 * MiB) == 0
    assert unwritten_room(0, 2 * MiB, fixed=5) == 5
    assert sum(m.time_ms for m in plan) == 4.0
    assert sum(m.time_ms for m in solve_kernel(k, [1, 2, 4, 8], 1 * MiB)) == 6.0   # the limit alone: 2 x (4, 3 ms)


def test_what_each_op_may_use_is_its_own_output_or_its_layers_dx():
    p = ConvProblem(8, 3, 32, 32, 16, 3, 3, pad=1, stride=2)
    fwd, bwd, bwf = (KernelBench("c", op, p, []) for op in ("forward", "backward_data", "backward_filter"))
    assert unwritten_bytes(fwd) == (16 * 16 * 16 * 4, 0)          # y per image (stride 2: 16 x 16)
    assert unwritten_bytes(bwd) == (3 * 32 * 32 * 4, 0)           # dx per image
    assert unwritten_bytes(bwf) == (0, 8 * 3 * 32 * 32 * 4)       # the whole dx, before backward data writes it


def test_plan_wr_marks_what_runs_in_unwritten_memory_and_the_plan_round_trips():
    """With ``unwritten=True`` a kernel that is faster with unwritten memory takes that plan: its configurations
    above the limit say ``workspace_from: unwritten``, the kernel's workspace counts only the others, and the plan's
    JSON (schema-checked) reads back the same; without it, plans are WR's as before."""
    from ucudnn.planning.plan import Plan
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.planning.wr import plan_wr

    rows = [(4, 1.0, 7 * MiB), (4, 3.0, 1 * MiB), (1, 1.0, 0)]
    p = ConvProblem(8, 64, 16, 16, 2048, 3, 3, pad=1)            # y: 2048 x 16 x 16 x 4 B = 2 MiB an image
    table = BenchmarkTable("GPU", 91900, [KernelBench("conv", "forward", p,
                                                      [Measurement(b, a, "FMA", t, ws)
                                                       for a, (b, t, ws) in enumerate(rows)])], "strict")
    plain = plan_wr(table, 1 * MiB)
    assert plain.kernels[0].time_ms == 6.0 and not any(c.unwritten for c in plain.kernels[0].configs)
    plan = plan_wr(table, 1 * MiB, unwritten=True)
    [k] = plan.kernels
    assert k.time_ms == 4.0 and [c.unwritten for c in k.configs] == [True, False]
    assert k.workspace_bytes == 1 * MiB and plan.workspace_bytes == 1 * MiB
    back = Plan.from_dict(plan.to_dict())
    assert [c.unwritten for c in back.kernels[0].configs] == [True, False]
    assert back.kernels[0].configs[0].to_dict()["workspace_from"] == "unwritten"


def test_unwritten_memory_is_a_wr_planning_choice_and_other_policies_refuse_it_by_name():
    """``plan(..., unwritten=True)`` with a policy that cannot use it is an error naming the field, not a plan that
    silently ignores the request."""
    import pytest

    from ucudnn.errors import InputError
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    p = ConvProblem(8, 64, 16, 16, 64, 3, 3, pad=1)
    table = BenchmarkTable("GPU", 91900, [KernelBench("conv", "forward", p, [Measurement(1, 0, "FMA", 1.0, 0)])],
                           "strict")
    for policy, kwargs in (("wd", {"total_workspace": "64MiB"}), ("undivided", {"workspace_limit": "64MiB"})):
        with pytest.raises(InputError) as e:
            plan(table, policy, unwritten=True, **kwargs)
        assert e.value.field == "unwritten"
    assert plan(table, "wr", workspace_limit="64MiB", unwritten=True).kernels[0].time_ms == 8.0


def test_the_librarys_lookups_plan_a_kernel_as_plan_wr_does_when_the_key_says_unwritten():
    """``ucudnn.catalog.lookup.wr_plan`` (every cache layer's answer) and ``plan_wr`` plan a kernel through the
    same :func:`~ucudnn.planning.wr.kernel_configs`: with ``unwritten: true`` in the plan key, the same marked
    configurations; without it, WR at the limit alone."""
    from ucudnn.catalog.lookup import wr_plan
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.planning.wr import plan_wr

    rows = [(4, 1.0, 7 * MiB), (4, 3.0, 1 * MiB), (1, 1.0, 0)]
    p = ConvProblem(8, 64, 16, 16, 2048, 3, 3, pad=1)
    kb = KernelBench("conv", "forward", p, [Measurement(b, a, "FMA", t, ws) for a, (b, t, ws) in enumerate(rows)])
    key = {"op": "forward", "workspace_limit": 1 * MiB, "batch_policy": "powerOfTwo"}
    table = BenchmarkTable("GPU", 91900, [kb], "strict")
    assert wr_plan(kb, {**key, "unwritten": True}).configs == plan_wr(table, 1 * MiB, unwritten=True).kernels[0].configs
    assert wr_plan(kb, key).configs == plan_wr(table, 1 * MiB).kernels[0].configs
    assert [c.unwritten for c in wr_plan(kb, {**key, "unwritten": True}).configs] == [True, False]


def test_ucudnn_unwritten_is_off_unless_turned_on_and_a_bad_value_names_the_variable(monkeypatch):
    import pytest

    from ucudnn import config
    from ucudnn.errors import InputError

    monkeypatch.delenv("UCUDNN_UNWRITTEN", raising=False)
    assert config.unwritten() is False
    for value, on in (("0", False), ("off", False), ("1", True), ("ON", True)):
        monkeypatch.setenv("UCUDNN_UNWRITTEN", value)
        assert config.unwritten() is on
    monkeypatch.setenv("UCUDNN_UNWRITTEN", "maybe")
    with pytest.raises(InputError) as e:
        config.unwritten()
    assert e.value.field == "UCUDNN_UNWRITTEN"


def test_the_lookups_take_unwritten_memory_only_for_a_gain_worth_the_python_launch_path():
    """A plan with unwritten memory leaves ``ucudnn.torch``'s compiled launch path; the lookups take it only when
    it is predicted faster by more than ``UNWRITTEN_MIN_GAIN_MS``, ``plan_wr`` (no launch path) for any gain."""
    from ucudnn.catalog.lookup import wr_plan
    from ucudnn.planning.wr import UNWRITTEN_MIN_GAIN_MS, kernel_configs

    small = UNWRITTEN_MIN_GAIN_MS / 4
    rows = [(4, 1.0, 7 * MiB), (4, 1.0 + small, 1 * MiB), (1, 1.0, 0)]      # the borrowing plan gains `small`
    p = ConvProblem(8, 64, 16, 16, 2048, 3, 3, pad=1)
    kb = KernelBench("conv", "forward", p, [Measurement(b, a, "FMA", t, ws) for a, (b, t, ws) in enumerate(rows)])
    key = {"op": "forward", "workspace_limit": 1 * MiB, "batch_policy": "powerOfTwo", "unwritten": True}
    assert not any(c.unwritten for c in wr_plan(kb, key).configs)
    assert any(c.unwritten for c in kernel_configs(kb, 1 * MiB, unwritten=True))


def test_the_apis_backward_filter_refuses_a_dx_buffer_of_another_shape_or_dtype_naming_the_field():
    """``conv2d_backward_filter(..., unwritten=dx)``: the buffer must be dx's (x's shape and dtype), checked
    before any plan is looked up."""
    import numpy as np
    import pytest

    from ucudnn import api
    from ucudnn.errors import InputError

    x, dy = np.zeros((4, 3, 8, 8), np.float32), np.zeros((4, 5, 6, 6), np.float32)
    for bad in (np.zeros((4, 3, 8, 9), np.float32), np.zeros((4, 3, 8, 8), np.float16)):
        with pytest.raises(InputError) as e:
            api.conv2d_backward_filter(x, dy, (5, 3, 3, 3), unwritten=bad)
        assert e.value.field == "unwritten"


@settings(max_examples=60, deadline=None)
@given(tables(), st.integers(0, 8), st.sampled_from(["forward", "backward_data", "backward_filter"]),
       st.floats(0.0, 5.0))
# found by CI: the same configurations summed in another order came out one rounding faster than WR's plan
@example((7, [(3, 1.1217255490428673, 0), (1, 50.0, 0)]), 0, "forward", 0.0)
def test_a_kernels_plan_takes_unwritten_memory_only_for_more_than_the_margin_and_only_above_the_limit(
        table, limit_mib, op, margin):
    """``kernel_configs(..., unwritten=True, min_gain_ms=m)``: the plan covers the batch; it is WR's plan at the limit
    unless the unwritten one is more than ``m`` ms faster; the configurations it marks are exactly those above the
    limit, and the kernel's workspace (what its buffer must hold) stays within the limit."""
    from ucudnn.planning.plan import KernelPlan
    from ucudnn.planning.wr import kernel_configs

    n, rows = table
    limit = limit_mib * MiB
    k = _kernel(op, n, rows)
    plain = kernel_configs(k, limit, "all")
    chosen = kernel_configs(k, limit, "all", unwritten=True, min_gain_ms=margin)
    assert sum(c.micro_batch for c in chosen) == n
    t_plain, t_chosen = (sum(c.time_ms for c in cs) for cs in (plain, chosen))
    if any(c.unwritten for c in chosen):
        assert t_chosen + margin < t_plain
    else:
        assert t_chosen == t_plain
    assert all(c.unwritten == (c.workspace_bytes > limit) for c in chosen)
    assert KernelPlan("k", op, k.problem, chosen).workspace_bytes <= limit
