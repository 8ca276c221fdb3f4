"""``ucudnn plan``: plan from recorded benchmark tables (no GPU) or by benchmarking a network (GPU)."""
from __future__ import annotations

import argparse

from .. import config
from ..planner import plan as make_plan
from ..table import BenchmarkTable

DEFAULT_TABLE = "builtin:alexnet-b256-float32-NCHW-h100"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan micro-batch divisions from a benchmark table (no GPU needed)",
                       description="Plan micro-batch divisions. With no --from-table, plans the shipped "
                                   f"real AlexNet table ({DEFAULT_TABLE}).")
    p.add_argument("--from-table", dest="tables", action="append", metavar="T.json",
                   help="benchmark table (ucudnn-benchmark-table/1); repeat to plan several together; "
                        "'builtin:NAME' for a shipped one")
    p.add_argument("--policy", choices=("wr", "wd", "undivided"), default=None,
                   help="wr: per-kernel limit (default); wd: whole-network budget "
                        "(default when UCUDNN_TOTAL_WORKSPACE_SIZE is set); undivided: cuDNN alone")
    p.add_argument("--workspace-limit", default=None, metavar="SIZE",
                   help="per-kernel workspace limit, e.g. 64MiB (default: UCUDNN_DEFAULT_WORKSPACE_LIMIT or 64MiB)")
    p.add_argument("--total-workspace", default=None, metavar="SIZE",
                   help="whole-network workspace budget for --policy wd (default: UCUDNN_TOTAL_WORKSPACE_SIZE)")
    p.add_argument("--batch-policy", default=None, metavar="POLICY",
                   help="all | powerOfTwo | undivided (default: UCUDNN_BATCH_SIZE_POLICY or powerOfTwo)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (ucudnn-plan/1)")
    p.add_argument("-o", "--out", metavar="PLAN.json", help="also write the plan JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    tables = [BenchmarkTable.load(t) for t in (args.tables or [DEFAULT_TABLE])]
    table = BenchmarkTable.merge(tables)
    total = args.total_workspace or config.total_workspace_size()
    policy = args.policy or ("wd" if args.total_workspace or config.total_workspace_size() else "wr")
    result = make_plan(table, policy,
                       workspace_limit=args.workspace_limit or config.default_workspace_limit(),
                       total_workspace=total,
                       batch_policy=args.batch_policy or config.batch_policy())
    if args.out:
        with open(args.out, "w") as f:
            f.write(result.to_json(indent=1) + "\n")
    if args.json:
        from ._output import print_json

        print_json(result.to_dict())
    else:
        from ._output import print_plan

        print_plan(result)
    return 0
