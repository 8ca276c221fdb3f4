"""benchmarks/torch_gaps.py's reading of a trace: the GPU's idle time between device events (CPU only)."""
from bench_scripts import load

gaps = load("torch_gaps")


def kernel(name, ts, dur, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_idle_time_is_what_no_device_event_covers_and_names_what_the_gpu_waited_for():
    events = [kernel("conv", 0, 100),
              kernel("side", 50, 80, stream=9),        # overlaps conv on another stream: no gap between them
              kernel("relu", 160, 10),                 # 30 us after side ends at 130
              {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 140, "dur": 5},   # host events are no GPU work
              kernel("Memset (Device)", 200, 2, cat="gpu_memset"),                      # 30 us after relu
              kernel("bn", 202, 8)]                    # back to back: no gap
    r = gaps.summarize(events, steps=2)
    assert r["gap_ms_per_step"] == 60 / 2 / 1e3
    assert r["span_ms_per_step"] == 210 / 2 / 1e3
    assert r["busy_ms_per_step"] == (100 + 80 + 10 + 2 + 8) / 2 / 1e3
    assert r["n_gaps"] == 1 and r["n_events"] == 2.5
    assert r["top_gaps"] == [(30, "side", "relu"), (30, "relu", "Memset (Device)")]
    assert dict(r["hist_us"]) == {30: 2}
    assert dict((tuple(k), v) for k, v in r["gap_us_by_pair_over_20us"]) == {("side", "relu"): 30,
                                                                              ("relu", "Memset (Device)"): 30}
    assert r["streams"] == {7: 4, 9: 1}
