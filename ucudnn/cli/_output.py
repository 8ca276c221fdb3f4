"""Rendering shared by subcommands: JSON for machines, rich tables for people."""
from __future__ import annotations

import json
import sys
from typing import Any

from ..planning.plan import Plan
from ..units import format_size


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=1, allow_nan=False)
    sys.stdout.write("\n")


def print_plan(plan: Plan, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    limit = (f"total workspace {format_size(plan.total_workspace)}" if plan.total_workspace is not None
             else f"workspace limit {format_size(plan.workspace_limit or 0)} per kernel")
    t = Table(title=title or f"{plan.policy.upper()} plan, {limit}, batch policy {plan.batch_policy} — {plan.device}",
              title_justify="left")
    t.add_column("kernel")
    t.add_column("micro-batches (size x count, algo/math)")
    t.add_column("time ms", justify="right")
    t.add_column("workspace", justify="right")
    if plan.total_workspace is not None:
        t.add_column("offset", justify="right")
    for k in plan.kernels:
        row = [k.name, k.summary(), f"{k.time_ms:.3f}", format_size(k.workspace_bytes)]
        if plan.total_workspace is not None:
            row.append(format_size(k.offset or 0))
        t.add_row(*row)
    t.add_section()
    total = ["total", "", f"{plan.total_time_ms:.3f}", format_size(plan.workspace_bytes)]
    t.add_row(*(total + ([""] if plan.total_workspace is not None else [])))
    Console().print(t)


def print_compare(summary: dict[str, Any]) -> None:
    """The ``--compare`` digest: each policy's predicted time and workspace at the same memory."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"same memory: WD total {format_size(summary['total_workspace'])}, "
                    f"WR / undivided {format_size(summary['workspace_limit'])} per kernel", title_justify="left")
    for col, just in (("policy", "left"), ("time ms", "right"), ("workspace (largest / sum)", "right"),
                      ("WD speedup", "right")):
        t.add_column(col, justify=just)
    for name, p in summary["policies"].items():
        if "error" in p:
            t.add_row(name, "infeasible", p["error"], "")
            continue
        t.add_row(name, f"{p['total_time_ms']:.3f}",
                  f"{format_size(p['workspace_bytes'])} / {format_size(p['workspace_sum_bytes'])}",
                  f"{p['wd_speedup']:.3f}x" if "wd_speedup" in p else "")
    Console().print(t)


def print_inference_plan(doc: dict[str, Any]) -> None:
    """An inference plan (ucudnn-inference-plan/1): its steps, then the baselines it was compared with."""
    from rich.console import Console
    from rich.table import Table

    from ..planning.plan import KernelPlan

    t = Table(title=f"inference plan: {doc['network']['name']} batch {doc['batch']} {doc['dtype']} "
                    f"({doc['numerics']}), {format_size(doc['workspace_limit'])} per conv, input "
                    f"{doc['input_layout']} — {doc.get('device', '')}", title_justify="left")
    t.add_column("step")
    t.add_column("kind")
    t.add_column("layout")
    t.add_column("how")
    t.add_column("time ms", justify="right")
    for s in doc["steps"]:
        how = ""
        if s["kind"] in ("conv", "wide_conv"):
            how = KernelPlan.from_dict(s["kernel_plan"]).summary()
            if "epilogue" in s:
                how = f"cuDNN conv+bias+act {s['epilogue']['engine']}"
            if s["kind"] == "wide_conv":
                how = f"{' + '.join(s['convs'])} as one conv: {how}"
        elif s["kind"] == "fused":
            how = f"{s['mode']} {len(s['convs'])} convs, tiling {s['tiling']}"
        elif s["kind"] == "transform":
            how = f"{s['from']} -> {s['to']}"
        t.add_row(s["name"], s["kind"], s["layout"], how, f"{s['ms']:.4f}")
    t.add_section()
    t.add_row("total (predicted)", "", "", "", f"{doc['predicted_ms']:.4f}")
    for k, v in doc["baselines"].items():
        label = {"seed_heuristic": "seed 000's layout rule", "unfused": "no fusion"}.get(k, f"all {k}")
        t.add_row(f"  baseline: {label}", "", "", "", "-" if v is None else f"{v:.4f}")
    Console().print(t)
