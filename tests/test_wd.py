"""WD: one budget for the whole table, divided by an ILP over desirable configurations."""
from __future__ import annotations

import itertools

import pytest
import synthetic
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InfeasibleError, InputError
from ucudnn.planning import planner, wr
from ucudnn.planning.arena import ALIGNMENT, align_up
from ucudnn.planning.pareto import desirable_sets
from ucudnn.planning.plan import Plan
from ucudnn.planning.wd import plan_wd

MiB = synthetic.MiB
UNLIMITED = 1 << 40

tables = st.builds(synthetic.table, n_kernels=st.integers(1, 4), batch=st.sampled_from([4, 8, 16]),
                   policy=st.sampled_from(["all", "powerOfTwo"]), seed=st.integers(0, 10_000),
                   repeats=st.integers(1, 2))


def policy_of(table) -> str:
    return "all" if len(table.kernels[0].micro_batches()) == table.kernels[0].problem.n else "powerOfTwo"


@settings(max_examples=30, deadline=None)
@given(tables)
def test_an_unlimited_budget_gives_every_kernel_its_fastest_configuration(table):
    policy = policy_of(table)
    plan = plan_wd(table, UNLIMITED, policy)
    for k, kp in zip(table.kernels, plan.kernels):  # the WR DP with no limit is the independent oracle
        assert kp.time_ms == pytest.approx(sum(m.time_ms for m in wr.plan_kernel(k, UNLIMITED, policy)), rel=1e-12)
    assert plan.stats["optimal"] is True


@settings(max_examples=40, deadline=None)
@given(tables, st.sampled_from([0, 1, 3, 8, 40]).map(lambda n: n * MiB // 2))
def test_wd_is_never_slower_than_wr_when_given_the_sum_of_wr_limits(table, limit):
    policy = policy_of(table)
    try:
        wr_plan = planner.plan(table, "wr", workspace_limit=limit, batch_policy=policy)
    except InfeasibleError:
        return
    wd_plan = plan_wd(table, len(table.kernels) * align_up(limit), policy)
    assert wd_plan.total_time_ms <= wr_plan.total_time_ms + 1e-9


@settings(max_examples=40, deadline=None)
@given(tables, st.integers(0, 200 * MiB))
def test_the_plan_respects_the_budget_with_aligned_disjoint_segments(table, budget):
    try:
        plan = plan_wd(table, budget, policy_of(table))
    except InfeasibleError as e:
        assert e.min_workspace is not None and e.min_workspace > budget
        return
    assert plan.workspace_bytes <= budget
    segments = sorted((k.offset, k.offset + k.workspace_bytes) for k in plan.kernels)
    assert all(start % ALIGNMENT == 0 for start, _ in segments)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(segments, segments[1:]))


@settings(max_examples=25, deadline=None)
@given(st.builds(synthetic.table, n_kernels=st.integers(1, 3), batch=st.sampled_from([4, 8]),
                 policy=st.just("powerOfTwo"), seed=st.integers(0, 10_000), repeats=st.integers(1, 2)),
       st.integers(0, 60 * MiB))
def test_the_ilp_finds_the_optimum_of_brute_force_over_desirable_sets(table, budget):
    sets = desirable_sets(table, "powerOfTwo")
    feasible = [sum(c.time_ms for c in combo) for combo in itertools.product(*sets.values())
                if sum(align_up(c.workspace_bytes) for c in combo) <= budget]
    if not feasible:
        with pytest.raises(InfeasibleError):
            plan_wd(table, budget, "powerOfTwo")
        return
    assert plan_wd(table, budget, "powerOfTwo").total_time_ms == pytest.approx(min(feasible), rel=1e-9)


def test_an_infeasible_budget_names_the_smallest_feasible_one_which_then_works():
    t = synthetic.table(n_kernels=4, batch=16, policy="powerOfTwo")
    # drop every zero-workspace option so the smallest configuration needs workspace
    for k in t.kernels:
        k.measurements = [m for m in k.measurements if m.workspace_bytes > 0]
    sets = desirable_sets(t, "powerOfTwo")
    smallest = sum(align_up(configs[0].workspace_bytes) for configs in sets.values())
    assert smallest > 0
    with pytest.raises(InfeasibleError, match="smallest feasible total") as e:
        plan_wd(t, smallest - 1, "powerOfTwo")
    assert e.value.min_workspace == smallest
    assert plan_wd(t, smallest, "powerOfTwo").workspace_bytes <= smallest


def test_a_kernel_with_no_configuration_at_all_is_named():
    t = synthetic.table(n_kernels=2, batch=8, policy="powerOfTwo")
    t.kernels[1].measurements = [m for m in t.kernels[1].measurements if m.micro_batch == 8 and False]
    with pytest.raises(InfeasibleError, match="conv1/forward") as e:
        plan_wd(t, UNLIMITED, "powerOfTwo")
    assert e.value.min_workspace is None


def test_stats_report_variables_solver_status_and_times():
    t = synthetic.table(n_kernels=3, batch=16, policy="powerOfTwo", repeats=2)
    plan = plan_wd(t, 20 * MiB, "powerOfTwo")
    s = plan.stats
    assert s["status"] == "Optimal" and s["optimal"] is True
    assert s["variables"] > 0
    assert s["constraints"] == len(t.kernels) + 1 + s["symmetry_constraints"]
    assert s["symmetry_constraints"] <= 3  # one per repeated kernel: three kernels appear twice
    assert s["solve_seconds"] >= 0 and s["dp_seconds"] >= 0
    assert s["unique_kernels"] == 3


def test_repeated_kernels_get_one_variable_per_configuration_each():
    t = synthetic.table(n_kernels=2, batch=16, policy="powerOfTwo", repeats=3)
    sets = desirable_sets(t, "powerOfTwo")
    plan = plan_wd(t, UNLIMITED, "powerOfTwo")
    assert plan.stats["variables"] == sum(len(c) for c in sets.values())


def test_planner_accepts_size_strings_and_the_plan_round_trips_through_its_schema():
    t = synthetic.table(n_kernels=3, batch=16, policy="powerOfTwo")
    plan = planner.plan(t, "wd", total_workspace="120MiB", batch_policy="powerOfTwo")
    assert plan.policy == "wd" and plan.total_workspace == 120 * MiB
    doc = plan.to_dict()
    assert all("offset" in k for k in doc["kernels"])
    again = Plan.from_dict(doc)
    assert again.total_time_ms == plan.total_time_ms and again.workspace_bytes == plan.workspace_bytes


def test_unknown_or_missing_solvers_are_refused_by_field():
    t = synthetic.table(n_kernels=1, batch=4, policy="powerOfTwo")
    with pytest.raises(InputError, match="solver"):
        plan_wd(t, MiB, "powerOfTwo", solver="glpk")
    with pytest.raises(InputError, match="total_workspace"):
        plan_wd(t, "-1MiB", "powerOfTwo")
    pulp = pytest.importorskip("pulp")
    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        assert plan_wd(t, MiB, "powerOfTwo", solver="highs").stats["optimal"] is True
    else:
        with pytest.raises(InputError, match="solver"):
            plan_wd(t, MiB, "powerOfTwo", solver="highs")


def test_a_zero_budget_works_when_zero_workspace_configurations_exist():
    t = synthetic.table(n_kernels=3, batch=8, policy="powerOfTwo")
    plan = plan_wd(t, 0, "powerOfTwo")
    assert plan.workspace_bytes == 0 and all(k.workspace_bytes == 0 for k in plan.kernels)


# -- the command line -------------------------------------------------------------------------------------------

def _cli(argv, capsys):
    from ucudnn.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "T.json"
    synthetic.table(n_kernels=5, batch=64, policy="powerOfTwo", repeats=2).save(path)
    return str(path)


def test_the_issue_command_prints_total_time_and_each_kernels_configuration_and_offset(table_file, capsys):
    import json

    rc, out, _ = _cli(["plan", "--from-table", table_file, "--policy", "wd", "--total-workspace", "120MiB",
                       "--batch-policy", "powerOfTwo", "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["policy"] == "wd" and doc["total_workspace"] == 120 * MiB
    assert doc["total_time_ms"] == pytest.approx(sum(k["time_ms"] for k in doc["kernels"]))
    assert all("offset" in k and k["micro_batches"] for k in doc["kernels"])
    assert doc["workspace_bytes"] <= 120 * MiB


def test_compare_reports_wd_wr_and_undivided_at_the_same_memory(table_file, capsys):
    import json

    rc, out, _ = _cli(["plan", "--from-table", table_file, "--policy", "wd", "--total-workspace", "20MiB",
                       "--batch-policy", "powerOfTwo", "--json", "--compare"], capsys)
    assert rc == 0
    cmp = json.loads(out)["compare"]
    assert cmp["total_workspace"] == 20 * MiB and cmp["workspace_limit"] == 20 * MiB // 10
    pol = cmp["policies"]
    assert set(pol) == {"wd", "wr", "undivided"}
    assert pol["wd"]["total_time_ms"] == pytest.approx(json.loads(out)["total_time_ms"])
    assert pol["wr"]["wd_speedup"] >= 1 - 1e-9 and pol["undivided"]["wd_speedup"] >= 1 - 1e-9


def test_compare_prints_a_summary_table_for_people(table_file, capsys):
    rc, out, _ = _cli(["plan", "--from-table", table_file, "--policy", "wd", "--total-workspace", "20MiB",
                       "--compare"], capsys)
    assert rc == 0
    assert "WD speedup" in out and "undivided" in out and "offset" in out


def test_an_infeasible_budget_exits_3_naming_the_smallest_total(table_file, capsys):
    from ucudnn.planning.table import BenchmarkTable

    t = BenchmarkTable.load(table_file)
    for k in t.kernels:
        k.measurements = [m for m in k.measurements if m.workspace_bytes > 0]
    t.save(table_file)
    rc, _, err = _cli(["plan", "--from-table", table_file, "--policy", "wd", "--total-workspace", "1KiB"], capsys)
    assert rc == 3 and "smallest feasible total" in err


def test_planning_a_network_needs_a_gpu_and_says_so_with_exit_code_4(capsys, monkeypatch):
    from ucudnn.binding import gpu

    if gpu.gpu_available():
        pytest.skip("a GPU is present: this checks the refusal without one")
    rc, _, err = _cli(["plan", "--network", "alexnet", "--batch", "8", "--policy", "wd", "--total-workspace", "8MiB"],
                      capsys)
    assert rc == 4 and ("CuPy" in err or "GPU" in err)


# -- real tables recorded on an H100 (shipped in ucudnn/data/tables) ------------------------------------------------

def _builtin(name):
    from ucudnn.planning.table import BenchmarkTable, builtin_tables

    if name not in builtin_tables():
        pytest.skip(f"no shipped table {name}")
    return BenchmarkTable.load(f"builtin:{name}")


def test_real_alexnet_wd_at_120mib_is_predicted_faster_than_wr_at_8mib_per_kernel():
    t = _builtin("alexnet-b256-float32-NCHW-h100")
    assert len(t.kernels) == 15
    wr_plan = planner.plan(t, "wr", workspace_limit="8MiB", batch_policy="powerOfTwo")
    wd_plan = planner.plan(t, "wd", total_workspace="120MiB", batch_policy="powerOfTwo")
    assert wd_plan.workspace_bytes <= 120 * MiB and wd_plan.stats["optimal"]
    assert wd_plan.total_time_ms < wr_plan.total_time_ms


def test_real_resnet50_table_expands_to_all_159_kernels_of_the_network():
    from ucudnn.planning.network import load_network

    t = _builtin("resnet50-b128-float32-NCHW-h100")
    net = load_network("resnet50").table_from(t)
    assert len(net.kernels) == 159 and len(t.kernels) < 159
    wd_plan = plan_wd(net, 159 * 8 * MiB, "powerOfTwo")
    wr_plan = planner.plan(net, "wr", workspace_limit="8MiB", batch_policy="powerOfTwo")
    assert wd_plan.stats["optimal"] and wd_plan.total_time_ms <= wr_plan.total_time_ms
    assert wd_plan.stats["unique_kernels"] == len({(k.problem, k.op) for k in t.kernels})


def test_a_network_the_table_does_not_cover_is_refused_naming_the_kernels(table_file, capsys):
    rc, _, err = _cli(["plan", "--from-table", table_file, "--network", "vgg16", "--policy", "wd",
                       "--total-workspace", "1GiB"], capsys)
    assert rc == 2 and "network" in err and "conv1_1/forward" in err
