"""benchmarks/torch_zoo.py's report: from recorded runs alone (no GPU, no torch), each converted model against
PyTorch's run of the same model and mode; synthetic records so every verdict is known in advance."""
from __future__ import annotations

import json

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def zoo():
    return load("torch_zoo")


def run(model, impl, images, loss_first, loss_last, status="ok", mode="fp32", **extra):
    return {"model": model, "batch": 64, "mode": mode, "impl": impl, "cap_pct": None, "status": status,
            "images_per_s": images if status == "ok" else None, "peak_allocated": 3 << 30,
            "peak_reserved": 4 << 30, "first_step_s": 2.0, "loss_first": loss_first, "loss_last": loss_last,
            "device": "NVIDIA H200", "torch": "2.11.0+cu130", "cudnn": 91900,
            "recorded_at": "2026-11-29T01:00:00+00:00", **extra}


def test_rows_pair_each_converted_run_with_pytorchs_and_judge_the_losses(zoo, tmp_path):
    records = [run("convnext_tiny", "torch", 100.0, 6.9, 6.5), run("convnext_tiny", "ucudnn-64", 120.0, 6.9, 6.5),
               run("densenet121", "torch", 200.0, 7.0, 6.0),
               # the first loss agrees, the last one drifted past the tolerance: trains, but not like PyTorch
               run("densenet121", "ucudnn-64", 180.0, 7.0, 6.1, n_warnings=1, warnings=["a layer ran through torch"]),
               run("inception_v3", "torch", 50.0, 7.1, 6.9),
               run("inception_v3", "ucudnn-64", None, None, None, status="oom", error="CUDA out of memory")]
    rows = {r["model"]: r for r in zoo.rows(records)}
    assert rows["convnext_tiny"]["speedup"] == pytest.approx(1.2) and rows["convnext_tiny"]["trains_like_torch"]
    assert rows["densenet121"]["speedup"] == pytest.approx(0.9) and not rows["densenet121"]["trains_like_torch"]
    assert rows["densenet121"]["loss_last_rel"] == pytest.approx(0.1 / 6.0)
    assert rows["inception_v3"]["speedup"] is None and not rows["inception_v3"]["trains_like_torch"]
    path = tmp_path / "zoo.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    md, js = tmp_path / "zoo.md", tmp_path / "zoo.json"
    assert zoo.report(path, md, js, "torch_zoo.py --report") == 0
    text = md.read_text()
    assert "- device: `NVIDIA H200`" in text                  # from the records, not from this machine
    assert "2 of 3 converted models train, 1 within the loss tolerance" in text
    assert "| convnext_tiny b64 | fp32 | ucudnn-64 | 100 | 120 | 1.20x |" in text
    assert "- densenet121: a layer ran through torch" in text
    assert "- inception_v3 fp32: ucudnn oom, PyTorch ok: CUDA out of memory" in text
    assert json.loads(js.read_text())["summary"]["speedup_median"] == pytest.approx(1.05)


def test_a_pytorch_control_run_gets_its_own_row_and_stays_out_of_the_summary(zoo, tmp_path):
    """``torch-heuristic`` (PyTorch with cuDNN's heuristic algorithms) is the yardstick of how far rounding alone
    moves a model's loss: reported beside the converted run, judged the same way, never counted as ucudnn's."""
    records = [run("inception_v3", "torch", 100.0, 7.0, 6.0),
               run("inception_v3", "ucudnn-64", 90.0, 7.0, 6.1),
               run("inception_v3", "torch-heuristic", 80.0, 7.0, 6.12)]
    rows = {r["impl"]: r for r in zoo.rows(records)}
    assert set(rows) == {"ucudnn-64", "torch-heuristic"}
    assert rows["torch-heuristic"]["loss_last_rel"] == pytest.approx(0.12 / 6.0)
    assert not rows["torch-heuristic"]["trains_like_torch"]
    path = tmp_path / "zoo.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    md, js = tmp_path / "zoo.md", tmp_path / "zoo.json"
    assert zoo.report(path, md, js, "torch_zoo.py --report") == 0
    text = md.read_text()
    assert "1 of 1 converted models train" in text
    assert "| inception_v3 b64 | fp32 | torch-heuristic | 100 | 80 | 0.80x |" in text
    summary = json.loads(js.read_text())["summary"]
    assert summary["speedup_median"] == pytest.approx(0.9) and summary["models"] == 1
