"""The library's plan lookup: in-process, user cache, plan server, installed bundles, then a local benchmark.

Fakes stand in for each layer (they record what was asked); the last tests
use real bundles made by ``ucudnn precompute`` and go through ``ucudnn.api``
with the GPU parts (device name, cuDNN version, benchmark) replaced.
"""
from __future__ import annotations

import logging

import pytest
from hypothesis import given, strategies as st

from ucudnn.catalog import lookup, near_keys
from ucudnn.catalog.store import key_id
from ucudnn.planning.plan import Plan
from ucudnn.planning.table import BenchmarkTable

H100, CUDNN = "NVIDIA H100 80GB HBM3", 91900
A100 = "NVIDIA A100-SXM4-80GB"
ALEXNET = "builtin:alexnet-b256-float32-NCHW-h100"
LIMIT = 64 << 20


@pytest.fixture(scope="module")
def kb():
    return BenchmarkTable.load(ALEXNET).kernel("conv2/forward")


def keys(kb, device=H100, cudnn=CUDNN):
    bench = {"device": device, "cudnn_version": cudnn, "problem": kb.problem.to_dict(), "op": kb.op,
             "numerics": "strict", "batch_policy": "powerOfTwo"}
    return {**bench, "workspace_limit": LIMIT}, bench


class Layer:
    """A store-like fake: answers the kernel bench (and plans) it holds, records every call."""

    def __init__(self, name, log, kb=None, targets=((H100, CUDNN),), fail=False):
        self.name, self.log, self.kb, self.held, self.fail = name, log, kb, set(targets), fail
        self.plans: dict[str, Plan] = {}
        self.benches: dict[str, object] = {}

    def _ask(self, what):
        self.log.append(f"{self.name}.{what}")
        if self.fail:
            raise ConnectionError(f"{self.name} is down")

    def find_plan(self, key):
        self._ask("find_plan")
        pid = key_id(key)
        return (pid, self.plans[pid]) if pid in self.plans else None

    def get_kernel_bench(self, key):
        self._ask("get_kernel_bench")
        return self.benches.get(key_id(key), self.kb)

    def put_kernel_bench(self, key, kb):
        self.log.append(f"{self.name}.put_kernel_bench")
        self.benches[key_id(key)] = kb

    def put_plan(self, key, plan, table_id=None):
        self.log.append(f"{self.name}.put_plan")
        self.plans[key_id(key)] = plan

    def targets(self):
        self._ask("targets")
        return self.held

    def close(self):
        pass


def run(kb, *, memory=None, store=None, server=None, bundles=(), device=H100, bench_log=None):
    plan_key, bench_key = keys(kb, device)
    opened = {b.name: b for b in bundles}

    def benchmark():
        if bench_log is not None:
            bench_log.append("benchmark")
        return kb

    return lookup.kernel_plan(plan_key, bench_key, benchmark=benchmark, memory=memory, store=store, server=server,
                              bundles=list(opened), open_bundle=lambda name: opened[name])


LAYERS = ["memory", "store", "server", "bundle", "benchmark"]


@pytest.mark.parametrize("first", LAYERS)
def test_the_first_layer_that_has_the_kernel_answers_and_later_ones_are_not_asked(kb, first):
    log: list[str] = []
    has = LAYERS[LAYERS.index(first):]
    memory = {}
    if "memory" in has:
        memory[key_id(keys(kb)[0])] = lookup.wr_plan(kb, keys(kb)[0])
    store = Layer("store", log, kb if "store" in has else None)
    server = Layer("server", log, kb if "server" in has else None)
    bundle = Layer("bundle", log, kb if "bundle" in has else None)
    found = run(kb, memory=memory, store=store, server=server, bundles=[bundle], bench_log=log)
    assert found.layer.split(":")[0] == first
    asked = [entry.split(".")[0] for entry in log if ".put_" not in entry]
    assert all(LAYERS.index(a) <= LAYERS.index(first) for a in asked), log
    assert found.plan.configs == lookup.wr_plan(kb, keys(kb)[0]).configs


def test_what_a_later_layer_finds_is_kept_in_the_user_cache(kb):
    log: list[str] = []
    store = Layer("store", log)
    server = Layer("server", log, kb)
    assert run(kb, memory={}, store=store, server=server).layer == "server"
    assert "store.put_kernel_bench" in log and "store.put_plan" in log
    log.clear()
    assert run(kb, memory={}, store=store, server=server).layer == "store"
    assert not any(e.startswith("server.") for e in log)


def test_a_local_benchmark_is_shared_with_the_plan_server(kb):
    log: list[str] = []
    found = run(kb, store=Layer("store", log), server=Layer("server", log), bench_log=log)
    assert found.layer == "benchmark" and "server.put_kernel_bench" in log


@pytest.mark.parametrize("held", [[(A100, 90100)], [(H100, 90100)], []],
                         ids=["another-device", "another-cudnn", "empty"])
def test_a_bundle_for_another_device_or_cudnn_is_skipped_with_a_logged_reason(kb, held, caplog):
    log: list[str] = []
    stranger = Layer("stranger.bundle", log, kb, targets=held)
    with caplog.at_level(logging.INFO, logger="ucudnn.lookup"):
        found = run(kb, store=Layer("store", log), bundles=[stranger], bench_log=log)
    assert found.layer == "benchmark" and "benchmark" in log
    assert "stranger.bundle.get_kernel_bench" not in log  # its measurements were never read
    [reason] = found.skipped
    assert "bundle stranger.bundle skipped" in reason and f"not for this {H100} / cuDNN {CUDNN}" in reason
    assert reason in caplog.text


def test_a_plan_in_a_bundle_labelled_for_another_device_is_not_used(kb, caplog):
    """Even under the right key, a stored plan that says it is for another GPU is refused."""
    log: list[str] = []
    plan_key, _ = keys(kb)
    odd = Layer("odd.bundle", log)
    odd.plans[key_id(plan_key)] = Plan("wr", "powerOfTwo", [lookup.wr_plan(kb, plan_key)], A100, CUDNN,
                                       workspace_limit=LIMIT)
    found = run(kb, bundles=[odd], bench_log=log)
    assert found.layer == "benchmark" and any("is for NVIDIA A100" in r for r in found.skipped)


def test_unreachable_server_and_broken_bundles_cost_a_benchmark_not_the_call(kb):
    log: list[str] = []
    broken = Layer("broken.bundle", log, kb, fail=True)
    good = Layer("good.bundle", log, kb)
    found = run(kb, store=Layer("store", log), server=Layer("server", log, kb, fail=True), bundles=[broken, good])
    assert found.layer == "bundle:good.bundle"
    assert any("plan server unavailable" in r for r in found.skipped)
    assert any("broken.bundle unreadable" in r for r in found.skipped)


def test_a_bundle_that_cannot_be_opened_is_skipped(kb, tmp_path):
    (tmp_path / "junk.bundle").write_bytes(b"junk" * 1000)
    found = lookup.kernel_plan(*keys(kb), benchmark=lambda: kb, bundles=[tmp_path / "junk.bundle"])
    assert found.layer == "benchmark" and "is not a ucudnn bundle" in found.skipped[0]


# -- real bundles through ucudnn.api --------------------------------------------------------------------------
@pytest.fixture
def h100_bundle(tmp_path_factory):
    from ucudnn.cli import main

    path = tmp_path_factory.mktemp("bundles") / "h100.bundle"
    assert main(["precompute", "--from-table", ALEXNET, "--workspace-limits", "64MiB", "--out", str(path),
                 "--no-progress"]) == 0
    return path


@pytest.fixture
def fake_gpu(monkeypatch, kb):
    """ucudnn.api on a pretend GPU: the device name and cuDNN version are set per test; benchmarks are counted."""
    import ucudnn.api as api

    calls: list[str] = []

    def benchmark(kernels, bp, nm, sources=None):
        calls.append(kernels[0].op)
        return BenchmarkTable(api.device_name(), api.cudnn.get_version(), [kb], nm)

    monkeypatch.setattr(api, "benchmark", benchmark)
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")   # the bundles here hold legacy measurements
    monkeypatch.setattr(api, "_store", None)
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setattr(api.cudnn, "get_version", lambda: CUDNN)

    def on(device):
        monkeypatch.setattr(api, "device_name", lambda: device)
        return api

    on.calls = calls
    return on


def test_the_library_plans_from_an_installed_bundle_without_benchmarking(h100_bundle, fake_gpu, monkeypatch, kb):
    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    api = fake_gpu(H100)
    kp = api._plan_from_store_or_bench(kb.problem, kb.op, LIMIT, "powerOfTwo", "strict")
    assert fake_gpu.calls == []
    assert kp.configs == lookup.wr_plan(kb, keys(kb)[0]).configs
    # now in the user cache: found there with the bundle gone
    monkeypatch.delenv("UCUDNN_BUNDLE_PATH")
    monkeypatch.setattr(api, "_plans", {})
    assert api._plan_from_store_or_bench(kb.problem, kb.op, LIMIT, "powerOfTwo", "strict").configs == kp.configs
    assert fake_gpu.calls == []


def test_the_library_refuses_a_bundle_of_another_device(h100_bundle, fake_gpu, monkeypatch, kb, caplog):
    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    api = fake_gpu(A100)
    with caplog.at_level(logging.INFO, logger="ucudnn.lookup"):
        api._plan_from_store_or_bench(kb.problem, kb.op, LIMIT, "powerOfTwo", "strict")
    assert fake_gpu.calls == ["forward"]  # measured here instead
    assert f"bundle {h100_bundle} skipped: it holds plans for {H100} / cuDNN {CUDNN}, not for this {A100}" \
        in caplog.text


# -- why a bundle did not answer ----------------------------------------------------------------------------
def _key(n=96, dtype="float32", layout="NCHW", numerics="strict", op="forward", c=64, **extra):
    problem = {"n": n, "c": c, "h": 27, "w": 27, "k": 192, "r": 5, "s": 5, "pad": [2, 2], "stride": [1, 1],
               "dilation": [1, 1], "groups": 1, "dtype": dtype, "layout": layout}
    return {"device": H100, "cudnn_version": CUDNN, "problem": problem, "op": op, "numerics": numerics,
            "batch_policy": "powerOfTwo", **extra}


def test_a_miss_names_the_batch_sizes_the_bundle_holds_the_convolution_at():
    held = [_key(n=256), _key(n=128), _key(n=128, numerics="tf32")]
    assert near_keys.why_missing(_key(n=96), held) == \
        "it holds this convolution at batch 128, batch 256 (this call: batch 96)"


def test_a_miss_names_the_closest_keys_differences_and_says_when_the_convolution_is_not_there_at_all():
    assert near_keys.why_missing(_key(), [_key(dtype="float16", layout="NHWC", numerics="default")]) == \
        "it holds this convolution at float16 (this call: float32); NHWC (this call: NCHW); " \
        "numerics default (this call: numerics strict)"
    # sources and the channel policy are left out of a key at their defaults (legacy alone, none)
    assert near_keys.why_missing(_key(sources="legacy,graph,fold"), [_key()]) == \
        "it holds this convolution at sources legacy (this call: sources legacy,graph,fold)"
    assert near_keys.why_missing(_key(), [_key(channel_policy="halves")]) == \
        "it holds this convolution at channel policy halves (this call: channel policy none)"
    # another op or shape is another convolution
    assert near_keys.why_missing(_key(), [_key(op="backward_data"), _key(c=96)]) == \
        "it holds no measurements of this convolution"
    assert near_keys.why_missing(_key(), []) == "it holds no measurements of this convolution"


def test_a_bundle_without_the_kernel_is_said_once_at_warning_level_with_why_then_benchmarked(
        h100_bundle, fake_gpu, monkeypatch, kb, caplog):
    """The bundle holds AlexNet at batch 256; a job at batch 300 (no larger batch held either) benchmarks, and the
    log says which batch the bundle was made for (the first miss of a bundle at warning level, later ones at
    debug)."""
    import dataclasses

    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    monkeypatch.setattr(lookup, "_warned_misses", set())
    api = fake_gpu(H100)
    with caplog.at_level(logging.DEBUG, logger="ucudnn.lookup"):
        for n in (300, 301):
            api._plan_from_store_or_bench(dataclasses.replace(kb.problem, n=n), kb.op, LIMIT, "powerOfTwo",
                                          "strict")
    assert fake_gpu.calls == ["forward", "forward"]   # measured here: the bundle has neither batch
    misses = [r for r in caplog.records if "has no measurements" in r.getMessage()]
    assert [r.levelno for r in misses] == [logging.WARNING, logging.DEBUG]
    first = misses[0].getMessage()
    assert f"bundle {h100_bundle} has no measurements of forward n300 c96 27x27 -> k256 5x5" in first
    assert "it holds this convolution at batch 256 (this call: batch 300)" in first


# -- a smaller batch from a larger batch's measurements -----------------------------------------------------------
def _at(kb, n):
    """``kb``'s kernel at mini-batch ``n`` (the problem only: its rows stay the larger batch's)."""
    import dataclasses

    return dataclasses.replace(kb.problem, n=n)


def _bench_key(kb, n, policy="powerOfTwo"):
    return {**keys(kb)[1], "problem": _at(kb, n).to_dict(), "batch_policy": policy}


def _measured_at(kb, n):
    """What measuring only micro-batch ``n`` gives, made from ``kb``'s rows at the next power of two (scaled)."""
    import dataclasses

    from ucudnn.planning.table import KernelBench

    src = min(m for m in kb.micro_batches() if m >= n)
    rows = [dataclasses.replace(m, micro_batch=n, time_ms=m.time_ms * n / src) for m in kb.measurements
            if m.micro_batch == src]
    return KernelBench(kb.name, kb.op, _at(kb, n), rows, [], 1.5)


@pytest.mark.parametrize("n", [96, 200, 3, 65])
def test_a_smaller_batch_takes_the_larger_batchs_micro_batches_and_measures_only_its_own_size(kb, n):
    asked: list[int] = []
    got = near_keys.from_larger_batch(kb, _bench_key(kb, n),
                                      lambda sizes: (asked.append(sizes), _measured_at(kb, n))[1])
    assert asked == [[n]]
    from ucudnn.policy import micro_batch_sizes

    assert got.problem.n == n and got.micro_batches() == micro_batch_sizes("powerOfTwo", n)
    for m in micro_batch_sizes("powerOfTwo", n)[:-1]:   # the larger batch's rows, as they are
        assert [r for r in got.measurements if r.micro_batch == m] == [r for r in kb.measurements if r.micro_batch == m]
    plan = lookup.wr_plan(got, {**_bench_key(kb, n), "workspace_limit": LIMIT})
    assert sum(c.micro_batch for c in plan.configs) == n


def test_a_size_the_larger_batchs_policy_measured_needs_no_measurement_and_undivided_cannot_be_derived(kb):
    def never(sizes):
        raise AssertionError(f"nothing should be measured, asked {sizes}")

    got = near_keys.from_larger_batch(kb, _bench_key(kb, 64), never)   # 64 is one of 256's powers of two
    assert got.micro_batches() == [1, 2, 4, 8, 16, 32, 64] and got.benchmark_seconds is None
    assert near_keys.from_larger_batch(kb, _bench_key(kb, 96, "undivided"), never) is None
    assert near_keys.from_larger_batch(kb, _bench_key(kb, 256), never) is None   # not smaller
    assert near_keys.from_larger_batch(kb, _bench_key(kb, 300), never) is None


def test_an_odd_batchs_even_splits_are_the_only_sizes_measured_beside_a_larger_batchs_powers_of_two(kb):
    """``powerOfTwoAndEvenSplits`` at 127 wants 3, 7, 15, 31, 63 and 127 besides the powers of two 256 measured:
    only those are measured, the rest taken from 256's rows, and WR plans 127 from them; 64 is all powers of two
    (nothing measured)."""
    def never(sizes):
        raise AssertionError(f"nothing should be measured, asked {sizes}")

    from ucudnn.planning.table import KernelBench
    from ucudnn.policy import micro_batch_sizes

    asked: list[list[int]] = []

    def measure(sizes):
        asked.append(sizes)
        return KernelBench(kb.name, kb.op, _at(kb, 127), [m for s in sizes for m in _measured_at(kb, s).measurements],
                           [], 2.0)

    key = _bench_key(kb, 127, "powerOfTwoAndEvenSplits")
    got = near_keys.from_larger_batch(kb, key, measure)
    assert asked == [[3, 7, 15, 31, 63, 127]]
    assert got.problem.n == 127 and got.micro_batches() == micro_batch_sizes("powerOfTwoAndEvenSplits", 127)
    for m in (1, 2, 4, 8, 16, 32, 64):                  # the larger batch's rows, as they are
        assert [r for r in got.measurements if r.micro_batch == m] == [r for r in kb.measurements if r.micro_batch == m]
    plan = lookup.wr_plan(got, {**key, "workspace_limit": LIMIT})
    assert sum(c.micro_batch for c in plan.configs) == 127
    got = near_keys.from_larger_batch(kb, _bench_key(kb, 64, "powerOfTwoAndEvenSplits"), never)
    assert got.micro_batches() == [1, 2, 4, 8, 16, 32, 64]


def test_the_library_plans_a_smaller_batch_from_a_bundles_larger_one_measuring_its_own_size_once(
        h100_bundle, fake_gpu, monkeypatch, kb, caplog):
    """The bundle holds AlexNet conv2 at batch 256: a job at batch 96 measures only micro-batch 96 (the undivided
    policy) and plans with the bundle's micro-batches up to 64; at batch 64 it measures nothing; both are in the
    user cache afterwards."""
    import ucudnn.api as api_module
    from ucudnn.catalog.store import Store

    policies: list[str] = []

    def benchmark(kernels, bp, nm, sources=None):
        policies.append(bp)
        return BenchmarkTable(H100, CUDNN, [_measured_at(kb, k.problem.n) for k in kernels], nm)

    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    api = fake_gpu(H100)
    monkeypatch.setattr(api_module, "benchmark", benchmark)
    store = Store(f"sqlite:///{h100_bundle.parent / 'user.db'}")
    monkeypatch.setattr(api_module, "_store", store)
    kp96 = api._plan_from_store_or_bench(_at(kb, 96), kb.op, LIMIT, "powerOfTwo", "strict")
    assert policies == ["undivided"] and sum(c.micro_batch for c in kp96.configs) == 96
    kp64 = api._plan_from_store_or_bench(_at(kb, 64), kb.op, LIMIT, "powerOfTwo", "strict")
    assert policies == ["undivided"] and sum(c.micro_batch for c in kp64.configs) == 64
    for n, kp in ((96, kp96), (64, kp64)):   # the next process finds both in its user cache
        monkeypatch.setattr(api_module, "_plans", {})
        assert api._plan_from_store_or_bench(_at(kb, n), kb.op, LIMIT, "powerOfTwo", "strict").configs == kp.configs
    assert policies == ["undivided"]
    held = store.get_kernel_bench(api_module._cache_key(_at(kb, 96), kb.op, "strict", "powerOfTwo"))
    assert held.micro_batches() == [1, 2, 4, 8, 16, 32, 64, 96]



def test_an_even_splits_job_plans_an_odd_batch_from_a_powerOfTwo_bundle_measuring_only_its_even_splits(
        h100_bundle, fake_gpu, monkeypatch, kb):
    """The bundle (``powerOfTwo``, batch 256) serves an even-splits job: at 127 only the sizes 256's powers of two
    lack are measured (3, 7, 15, 31, 63, 127: one benchmark, each as the undivided policy's one size) and WR plans
    127 from them and the bundle's rows; at 128 (a power of two, keyed ``powerOfTwo``) nothing is measured."""
    import ucudnn.api as api_module
    from ucudnn.catalog.store import Store

    asked: list[tuple[str, list[int]]] = []

    def benchmark(kernels, bp, nm, sources=None):
        asked.append((bp, [k.problem.n for k in kernels]))
        return BenchmarkTable(H100, CUDNN, [_measured_at(kb, k.problem.n) for k in kernels], nm)

    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    api = fake_gpu(H100)
    monkeypatch.setattr(api_module, "benchmark", benchmark)
    monkeypatch.setattr(api_module, "_store", Store(f"sqlite:///{h100_bundle.parent / 'user.db'}"))
    kp = api._plan_from_store_or_bench(_at(kb, 127), kb.op, LIMIT, "powerOfTwoAndEvenSplits", "strict")
    assert asked == [("undivided", [3, 7, 15, 31, 63, 127])] and sum(c.micro_batch for c in kp.configs) == 127
    kp = api._plan_from_store_or_bench(_at(kb, 128), kb.op, LIMIT, "powerOfTwoAndEvenSplits", "strict")
    assert len(asked) == 1 and sum(c.micro_batch for c in kp.configs) == 128
    assert api_module._cache_key(_at(kb, 128), kb.op, "strict", "powerOfTwoAndEvenSplits")["batch_policy"] == \
        "powerOfTwo"


@given(policy=st.sampled_from(["powerOfTwo", "powerOfTwoAndMidpoints", "all"]),
       n=st.integers(1, 600), extra=st.integers(1, 600))
def test_every_size_a_policy_measures_below_a_batch_it_measures_for_every_larger_batch(policy, n, extra):
    """What from_larger_batch rests on: a smaller batch needs at most its own size measured."""
    from ucudnn.policy import micro_batch_sizes

    smaller, larger = micro_batch_sizes(policy, n), set(micro_batch_sizes(policy, n + extra))
    assert [m for m in smaller if m not in larger] in ([], [n])


def test_heuristic_mode_starts_a_smaller_batch_on_a_larger_batchs_measured_micro_batches(
        h100_bundle, fake_gpu, monkeypatch, kb):
    """UCUDNN_BENCHMARK=heuristic, a bundle at batch 256, a call at batch 96: the first plan is WR over the
    bundle's micro-batches up to 64 (measured rows, not cuDNN's untimed heuristic choice), nothing is measured
    now or stored for batch 96, and the background benchmark is asked for the kernel."""
    import types

    import ucudnn.api as api_module
    from ucudnn.measure import heuristic

    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(h100_bundle))
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    api = fake_gpu(H100)
    submitted: list[tuple] = []
    monkeypatch.setattr(api_module._background, "submit", submitted.append)
    monkeypatch.setattr(api_module, "cupy", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))))
    monkeypatch.setattr(heuristic, "heuristic_plan", lambda *a: pytest.fail("cuDNN's heuristic plan was asked"))
    kp = api._plan_from_store_or_bench(_at(kb, 96), kb.op, LIMIT, "powerOfTwo", "strict")
    assert fake_gpu.calls == []                              # nothing measured in the call
    assert sum(c.micro_batch for c in kp.configs) == 96 and max(c.micro_batch for c in kp.configs) <= 64
    assert [key[1].n for key in submitted] == [96]           # the whole kernel, batch 96 included, in background
    assert not api_module._plans                             # an incomplete table's plan is kept nowhere


def test_the_user_caches_keys_are_read_once_then_only_what_was_written_since(tmp_path, kb, monkeypatch):
    from ucudnn.catalog.store import Store

    store = Store(f"sqlite:///{tmp_path / 'user.db'}")
    import dataclasses

    reads: list[object] = []
    real = store.kernel_bench_keys
    monkeypatch.setattr(store, "kernel_bench_keys",
                        lambda *a, since=None: (reads.append(since), real(*a, since=since))[1])
    store.put_kernel_bench(_bench_key(kb, 256), kb)
    target = (H100, CUDNN)
    assert [k["problem"]["n"] for k in near_keys.store_keys(store, target)] == [256]
    store.put_kernel_bench(_bench_key(kb, 128), dataclasses.replace(kb, problem=_at(kb, 128)))
    assert sorted(k["problem"]["n"] for k in near_keys.store_keys(store, target)) == [128, 256]   # no duplicates
    assert reads[0] is None and all(isinstance(s, float) for s in reads[1:])
    # the smallest larger batch held is the one taken
    assert near_keys.find_larger_batch(_bench_key(kb, 96), target, store, [], None)[1].problem.n == 128
