"""Heuristic plans on a real GPU (skipped without one): they fit the limit, cover the mini-batch, run correctly
through the executor against one undivided cuDNN call, and take well under a second to make."""
from __future__ import annotations

import time

import pytest
from test_gpu_execute import TOL, _run_and_reference, rel_err

from ucudnn.errors import InfeasibleError
from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

OPS = ("forward", "backward_data", "backward_filter")
MiB = 1 << 20
CASES = {
    "odd-batch-255": ConvProblem(255, 16, 20, 20, 32, 3, 3, pad=(1, 1)),
    "c3-3x5-stride2": ConvProblem(37, 3, 23, 19, 16, 3, 5, pad=(1, 2), stride=(2, 2)),
    "nhwc-float16": ConvProblem(66, 16, 16, 16, 32, 3, 3, pad=(1, 1), dtype="float16", layout="NHWC"),
    "alexnet-conv1-nhwc-float16": ConvProblem(20, 3, 67, 67, 16, 11, 11, stride=(4, 4), dtype="float16",
                                              layout="NHWC"),
}


def _plan(problem, op, limit, numerics=None, policy="powerOfTwo"):
    from ucudnn.measure.heuristic import heuristic_plan

    return heuristic_plan(problem, op, limit, policy, numerics, name=f"test/{op}")


def _check_runs(plan, limit: int) -> None:
    """The plan covers the mini-batch within ``limit`` as the executor sizes it, and computes what cuDNN does
    undivided (given exactly the plan's workspace, no more)."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    assert plan.batch == plan.problem.n
    assert plan.workspace_bytes <= limit and Executor(plan).workspace_bytes <= limit
    assert all(c.source == "legacy" and c.extra["timed"] == "heuristic" for c in plan.configs)
    out, ref = _run_and_reference(plan, seed=hash((plan.problem, plan.op)) % 1000, exact_workspace=True)
    assert not cp.isnan(out).any()
    assert rel_err(out.get(), ref.get()) < TOL[plan.problem.dtype]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("limit", [0, 64 * MiB])
def test_heuristic_plans_fit_cover_the_batch_and_match_undivided_cudnn(name, op, limit):
    problem = CASES[name]
    try:
        plan = _plan(problem, op, limit)
    except InfeasibleError as e:   # the limit it names must then work
        assert e.min_workspace is not None and e.min_workspace > limit
        plan, limit = _plan(problem, op, e.min_workspace), e.min_workspace
    _check_runs(plan, limit)


# deterministic numerics leave these without a zero-workspace algorithm at the full batch on an H100 (cuDNN 9.19)
DIVIDING = [("alexnet-conv1-nhwc-float16", "backward_data", "default-deterministic"),
            ("nhwc-float16", "backward_filter", "default-deterministic"),
            ("odd-batch-255", "backward_filter", "strict-deterministic")]


@pytest.mark.parametrize("name, op, numerics", DIVIDING)
def test_a_limit_below_every_full_batch_candidate_divides_the_batch(name, op, numerics):
    problem = CASES[name]
    try:
        _plan(problem, op, 0, numerics, policy="undivided")
        pytest.skip("this cuDNN offers a zero-workspace candidate at the full batch: nothing to divide")
    except InfeasibleError as e:
        whole = e.min_workspace   # the least any candidate needs at the full batch
    assert whole is not None and whole > 0
    try:
        plan = _plan(problem, op, whole - 1, numerics)
    except InfeasibleError as e:   # no smaller size fits either: the full batch's need is the least that works
        assert e.min_workspace == whole
        return
    assert len(plan.configs) > 1 and all(c.micro_batch < problem.n for c in plan.configs)
    _check_runs(plan, whole - 1)


def test_a_heuristic_plan_takes_well_under_a_second():
    """A functional bound, not a benchmark: a few heuristic and workspace queries, nothing timed or run.  The
    warm-up (another problem) loads cuDNN's sub-libraries; the timed problems are new, so nothing is cached."""
    _plan(ConvProblem(8, 8, 12, 12, 8, 3, 3), "forward", 64 * MiB)
    for i, (name, problem) in enumerate(sorted(CASES.items())):
        fresh = problem.with_batch(problem.n + 1 + i)   # descriptors are cached per shape: never seen before
        for op in OPS:
            t0 = time.perf_counter()
            plan = _plan(fresh, op, 64 * MiB)
            seconds = time.perf_counter() - t0
            assert plan.batch == fresh.n
            assert seconds < 1.0, f"{name} {op}: {seconds:.3f} s"
    for name, op, numerics in DIVIDING:   # walking down every size, and the infeasible path that asks them all
        fresh = CASES[name].with_batch(CASES[name].n + 7)
        t0 = time.perf_counter()
        try:
            _plan(fresh, op, 0, numerics)
        except InfeasibleError:
            pass
        seconds = time.perf_counter() - t0
        assert seconds < 1.0, f"{name} {op} {numerics}: {seconds:.3f} s"
