"""``ucudnn plot``: pictures of a benchmark table's plans (needs the ``plot`` extra; no GPU).

    ucudnn plot desirable --from-table T.json --kernel conv2/forward --total-workspace 120MiB -o conv2.png
    ucudnn plot division --from-table T.json --total-workspace 120MiB -o division.svg
"""
from __future__ import annotations

import argparse
import sys

from .. import config
from ..errors import InputError
from ..planning.table import BenchmarkTable
from ..policy import POLICIES as BATCH_POLICIES
from ..units import format_size, parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a kernel's desirable set or the workspace division (PNG/SVG/PDF)",
                       description="Pictures of plans, as in the μ-cuDNN paper's Fig. 8 and Fig. 13.")
    what = p.add_subparsers(dest="picture", required=True, metavar="PICTURE")
    d = what.add_parser("desirable", help="time vs workspace of one kernel's desirable configurations (Fig. 8)")
    _common(d)
    d.add_argument("--kernel", required=True, help="kernel name in the table, e.g. conv2/forward")
    d.set_defaults(func=run_desirable)
    v = what.add_parser("division", help="workspace division across kernels: WD vs WR vs undivided (Fig. 13)")
    _common(v)
    v.set_defaults(func=run_division)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-table", dest="tables", action="append", required=True, metavar="T.json",
                   help="benchmark table; repeat to combine several; 'builtin:NAME' for a shipped one")
    p.add_argument("--total-workspace", metavar="SIZE", help="WD budget for the whole table, e.g. 120MiB")
    p.add_argument("--workspace-limit", metavar="SIZE", help="per-kernel limit (WR / undivided), e.g. 8MiB")
    p.add_argument("--batch-policy", default=None, help=" | ".join(BATCH_POLICIES) + " (default: UCUDNN_BATCH_SIZE_POLICY)")
    p.add_argument("-o", "--out", required=True, metavar="FILE", help="picture to write: .png, .svg or .pdf")


def _sizes(args: argparse.Namespace) -> tuple[int | None, int | None]:
    total = parse_size(args.total_workspace, "total_workspace") if args.total_workspace else None
    limit = parse_size(args.workspace_limit, "workspace_limit") if args.workspace_limit else None
    return total, limit


def run_desirable(args: argparse.Namespace) -> int:
    from ..planning.pareto import desirable_set, fastest_within
    from ..planning.plots import plot_desirable

    table = BenchmarkTable.merge([BenchmarkTable.load(t) for t in args.tables])
    batch_policy = args.batch_policy or config.batch_policy()
    try:
        kernel = table.kernel(args.kernel)
    except KeyError:
        names = ", ".join(k.name for k in table.kernels[:8]) + (" ..." if len(table.kernels) > 8 else "")
        raise InputError(f"no kernel {args.kernel!r} in the table; it has {names}", "kernel") from None
    configs = desirable_set(kernel, batch_policy)
    total, limit = _sizes(args)
    if total is not None:  # WD divides the budget over the whole table: the kernel's share is the ILP's choice
        from ..planning.wd import plan_wd

        chosen, how = plan_wd(table, total, batch_policy).kernel(kernel.name), f"WD, total {format_size(total)}"
    else:
        chosen = fastest_within(configs, limit if limit is not None else 1 << 62)
        how = f"WR, limit {format_size(limit)}" if limit is not None else "fastest"
    title = (f"{kernel.name} ({kernel.problem.describe()})\n{table.device}, batch policy {batch_policy}, "
             f"chosen: {how}")
    path = plot_desirable(configs, args.out, chosen=chosen, limit=limit, title=title)
    print(f"wrote {path}: {len(configs)} desirable configurations", file=sys.stderr)
    return 0


def run_division(args: argparse.Namespace) -> int:
    from ..errors import InfeasibleError
    from ..planning.plots import plot_division
    from ..planning.wd import compare_policies

    table = BenchmarkTable.merge([BenchmarkTable.load(t) for t in args.tables])
    batch_policy = args.batch_policy or config.batch_policy()
    total, limit = _sizes(args)
    if total is None and limit is None:
        raise InputError("give --total-workspace and/or --workspace-limit", "total_workspace")
    cmp = compare_policies(table, batch_policy, total_workspace=total, workspace_limit=limit)
    names = {"wd": f"WD, {format_size(cmp['total_workspace'])} total",
             "wr": f"WR, {format_size(cmp['workspace_limit'])} per kernel",
             "undivided": f"undivided, {format_size(cmp['workspace_limit'])} per kernel"}
    plans = {names[k]: p for k, p in cmp["plans"].items() if not isinstance(p, InfeasibleError)}
    for k, p in cmp["plans"].items():
        if isinstance(p, InfeasibleError):
            print(f"ucudnn: {k} left out: {p}", file=sys.stderr)
    path = plot_division(plans, args.out, title=f"workspace division, {table.device}, batch policy {batch_policy}")
    print(f"wrote {path}", file=sys.stderr)
    return 0
