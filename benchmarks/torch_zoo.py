"""Converted torchvision models no issue names: do they train, like PyTorch, and how fast (GPU machine).

Plans must generalise beyond the networks the issues measure.  This runs ``torch_train.py``'s training step
(synthetic data, one fresh process per run, ``cudnn.benchmark`` for PyTorch) on public models whose convolutions
the issue networks lack -- grouped (ResNeXt, RegNet), depthwise with 7x7 filters (ConvNeXt), 1x7 / 7x1 and 1x3 /
3x1 filters (Inception v3), channel shuffles and strided depthwise (ShuffleNet V2), dense concatenation of many
small layers (DenseNet), squeeze-and-excitation (MobileNet V3, RegNet-Y) -- with plain PyTorch and with
``ucudnn.torch.convert`` (64 MiB per kernel, the library's default sources), and reports for each model:

- whether the converted model trains (status), and what ucudnn said (``warnings``: a layer that ran through torch,
  a plan shrunk under memory pressure);
- the first and last step's loss against PyTorch's (same seed, weights and data in both processes: the first
  loss compares one forward, the last one after ``--warmup`` + ``--steps`` SGD steps);
- images/s and allocated / reserved peaks side by side, and the first step (ucudnn benchmarks every kernel there
  unless a plan cache or bundle has it).

    python benchmarks/torch_zoo.py --out /tmp/zoo.jsonl                  # runs (GPU), then the report
    python benchmarks/torch_zoo.py --report --out benchmarks/results/torch_zoo_h200.jsonl   # report only (CPU)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _report import md_header, provenance, write

HERE = Path(__file__).resolve().parent
MODELS = ("resnext50_32x4d@64,regnet_y_400mf@128,convnext_tiny@64,inception_v3@64,shufflenet_v2_x1_0@128,"
          "densenet121@64,mobilenet_v3_large@128,googlenet@128,squeezenet1_1@128")
#: the second set (2026-11-29, ``torch_zoo2_h200.md``): transformer patch convolutions (ViT-B/16's 16x16 stride 16
#: on 3 channels, Swin-T's 4x4 stride 4), 3x3 / 5x5 depthwise at strides 1 and 2 (EfficientNet-B0, MnasNet), an odd
#: batch (ResNet-18 at 127); ``--models more`` runs it, ``--models all`` both sets
MODELS_MORE = ("vit_b_16@64,swin_t@64,efficientnet_b0@128,mnasnet1_0@128,resnet18@127,mobilenet_v3_large@128,"
               "shufflenet_v2_x1_0@128,inception_v3@64")
IMPL = "ucudnn-64"
#: implementations a row may hold beside PyTorch's: the converted ones count in the summary; ``torch-heuristic``
#: (PyTorch with cuDNN's heuristic algorithms) is the yardstick of how far rounding alone moves the loss
CONTROLS = ("torch-heuristic",)
#: relative loss difference above which a row says "differs" (first: one forward; last: after the SGD steps)
LOSS_TOLERANCE = {"fp32": (1e-4, 2e-3), "default": (2e-3, 2e-2), "amp": (5e-3, 5e-2)}


def rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(b), 1e-12)


def rows(records: list[dict]) -> list[dict]:
    """One row per (model, batch, mode): PyTorch's run against the converted one (the last record of each)."""
    runs: dict[tuple, dict] = {}
    for r in records:
        if r.get("cap_pct") is None:
            runs[(r["model"], r["batch"], r["mode"], r["impl"])] = r
    out = []
    for (model, batch, mode, impl), ours in runs.items():
        if impl == "torch":
            continue
        base = runs.get((model, batch, mode, "torch"), {})
        first_tol, last_tol = LOSS_TOLERANCE[mode]
        d_first, d_last = rel(ours.get("loss_first"), base.get("loss_first")), \
            rel(ours.get("loss_last"), base.get("loss_last"))
        ok = ours.get("status") == "ok" and base.get("status") == "ok"
        out.append({
            "model": model, "batch": batch, "mode": mode, "impl": impl,
            "status": ours.get("status"), "torch_status": base.get("status"),
            "torch_images_per_s": base.get("images_per_s"), "images_per_s": ours.get("images_per_s"),
            "speedup": ours["images_per_s"] / base["images_per_s"] if ok else None,
            "torch_peak_allocated": base.get("peak_allocated"), "peak_allocated": ours.get("peak_allocated"),
            "torch_peak_reserved": base.get("peak_reserved"), "peak_reserved": ours.get("peak_reserved"),
            "torch_first_step_s": base.get("first_step_s"), "first_step_s": ours.get("first_step_s"),
            "loss_first_rel": d_first, "loss_last_rel": d_last,
            "trains_like_torch": ok and d_first is not None and d_first <= first_tol and d_last <= last_tol,
            "n_warnings": ours.get("n_warnings"), "warnings": ours.get("warnings", []),
            "launches_python": ours.get("launches_python"), "launches_compiled": ours.get("launches_compiled"),
            "error": ours.get("error") or base.get("error"),
        })
    return sorted(out, key=lambda r: (r["mode"], r["model"], r["impl"]))


def gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def report(path: Path, md_out: Path | None, json_out: Path | None, command: str) -> int:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = rows(records)
    devices = sorted({r.get("device") for r in records if r.get("device")})
    # where the runs were measured comes from their records, never from the machine writing the report
    here = provenance()
    when = sorted({r.get("recorded_at") for r in records if r.get("recorded_at")})
    prov = {"device": ", ".join(devices) or "not recorded",
            "cudnn_version": ", ".join(sorted({str(r["cudnn"]) for r in records if r.get("cudnn")})),
            "torch": ", ".join(sorted({r["torch"] for r in records if r.get("torch")})),
            "date": f"{when[0]} - {when[-1]}" if when else "not recorded", "command": command,
            "report_written": here["date"]}
    ours = [r for r in table if r["impl"] not in CONTROLS]
    ratios = [r["speedup"] for r in ours if r["speedup"]]
    summary = {"models": len(ours), "train": sum(r["status"] == "ok" for r in ours),
               "trains_like_torch": sum(bool(r["trains_like_torch"]) for r in ours),
               "speedup_median": statistics.median(ratios) if ratios else None,
               "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None}
    lines = [md_header("Converted torchvision models no issue names: training steps against PyTorch", prov),
             f"`{IMPL}` = `ucudnn.torch.convert(model, workspace_limit=64 MiB)` "
             "with the default sources; PyTorch with `cudnn.benchmark`; `torch-heuristic` (where present) = "
             "PyTorch with `cudnn.benchmark` off, another valid algorithm choice: its loss difference is what "
             "rounding alone does to that model (not counted in the summary).  Loss: relative difference to PyTorch's "
             "run (first: one forward from the same weights and data; last: after the warm-up and timed SGD steps). "
             "Peaks in GiB (allocated / reserved).",
             "",
             f"{summary['train']} of {summary['models']} converted models train, {summary['trains_like_torch']} "
             f"within the loss tolerance; images/s against PyTorch: median "
             f"{num(summary['speedup_median'], '.2f')}x, {num(summary['speedup_min'], '.2f')}-"
             f"{num(summary['speedup_max'], '.2f')}x.",
             "",
             "| model | mode | impl | PyTorch images/s | images/s | vs PyTorch | peaks PyTorch | peaks ucudnn | "
             "first step s (PyTorch / ucudnn) | loss first / last (rel) | trains like PyTorch | warnings |",
             "|---|---|---|---:|---:|---:|---|---|---|---|---|---:|"]
    for r in table:
        lines.append(
            f"| {r['model']} b{r['batch']} | {r['mode']} | {r['impl']} | {num(r['torch_images_per_s'], '.0f')} | "
            f"{num(r['images_per_s'], '.0f') if r['status'] == 'ok' else r['status']} | "
            f"{num(r['speedup'], '.2f')}{'x' if r['speedup'] else ''} | "
            f"{gib(r['torch_peak_allocated'])} / {gib(r['torch_peak_reserved'])} | "
            f"{gib(r['peak_allocated'])} / {gib(r['peak_reserved'])} | "
            f"{num(r['torch_first_step_s'], '.1f')} / {num(r['first_step_s'], '.1f')} | "
            f"{num(r['loss_first_rel'], '.1e')} / {num(r['loss_last_rel'], '.1e')} | "
            f"{'yes' if r['trains_like_torch'] else 'no'} | {'-' if r['n_warnings'] is None else r['n_warnings']} |")
    said = [(r["model"], w) for r in table for w in r["warnings"]]
    if said:
        lines += ["", "What ucudnn said (first warnings of each run):", ""]
        lines += [f"- {m}: {w}" for m, w in said]
    failed = [r for r in table if r["status"] != "ok" or r["torch_status"] != "ok"]
    if failed:
        lines += ["", "Runs that did not finish:", ""]
        lines += [f"- {r['model']} {r['mode']}: ucudnn {r['status']}, PyTorch {r['torch_status']}: {r['error']}"
                  for r in failed]
    md = "\n".join(lines) + "\n"
    doc = {"provenance": prov, "summary": summary, "rows": table}
    if md_out is not None:
        md_out.write_text(md)
        if json_out is not None:
            json_out.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        write(HERE / "results", "torch_zoo", doc, md)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS,
                    help="model@batch,... (torchvision names); 'more': the second set, 'all': both sets")
    ap.add_argument("--modes", default="fp32", help="fp32, default, amp (comma-separated)")
    ap.add_argument("--impls", default=IMPL,
                    help=f"implementations beside PyTorch's (torch_train.py's names; {', '.join(CONTROLS)}: a control)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--out", required=True, help="JSON lines of the runs (appended to)")
    ap.add_argument("--report", action="store_true", help="only write the report from --out's records")
    ap.add_argument("--report-md", default=None)
    ap.add_argument("--report-json", default=None)
    a = ap.parse_args(argv)
    command = "torch_zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])
    named = {"more": MODELS_MORE, "all": ",".join(dict.fromkeys(MODELS.split(",") + MODELS_MORE.split(",")))}
    a.models = named.get(a.models, a.models)
    if not a.report:
        only = ",".join(f"{m}:{mode}" for m in a.models.split(",") for mode in a.modes.split(","))
        subprocess.run([sys.executable, str(HERE / "torch_train.py"), "--only", only, "--impls", f"torch,{a.impls}",
                        "--steps", str(a.steps), "--warmup", str(a.warmup), "--timeout", str(a.timeout),
                        "--out", a.out], check=False)
    return report(Path(a.out), Path(a.report_md) if a.report_md else None,
                  Path(a.report_json) if a.report_json else None, command)


if __name__ == "__main__":
    sys.exit(main())
