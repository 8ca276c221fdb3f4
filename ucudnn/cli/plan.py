"""``ucudnn plan``: plan from recorded benchmark tables (no GPU) or by benchmarking a network (GPU)."""
from __future__ import annotations

import argparse

from .. import config
from ..errors import InputError
from ..planning.planner import plan as make_plan
from ..planning.table import BenchmarkTable
from ..policy import POLICIES as BATCH_POLICIES

DEFAULT_TABLE = "builtin:alexnet-b256-float32-NCHW-h100"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan micro-batch divisions from a benchmark table (no GPU needed)",
                       description="Plan micro-batch divisions. With no --from-table, plans the shipped "
                                   f"real AlexNet table ({DEFAULT_TABLE}).")
    p.add_argument("--from-table", dest="tables", action="append", metavar="T.json",
                   help="benchmark table (ucudnn-benchmark-table/1); repeat to plan several together; "
                        "'builtin:NAME' for a shipped one")
    p.add_argument("--network", metavar="NAME|FILE.json",
                   help="plan a network's conv kernels (alexnet, resnet50, ... or a ucudnn-network/1 file): with "
                        "--from-table, every kernel of the network is looked up in the table (repeated layers "
                        "included, no GPU); alone, they are benchmarked on this GPU first")
    p.add_argument("--batch", type=int, help="with --network: mini-batch size (default: the table's, else the network's)")
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"),
                   help="with --network (default: the table's, else float32)")
    p.add_argument("--layout", default=None, choices=("NCHW", "NHWC"),
                   help="with --network (default: the table's, else NCHW)")
    p.add_argument("--save-table", metavar="T.json", help="with --network alone: also write the measured table here")
    p.add_argument("--sources", default=None, metavar="NAMES",
                   help="with --network alone: algorithm sources to benchmark (see `ucudnn bench --sources`; "
                        "default: UCUDNN_SOURCES, else legacy,graph,depthwise,fold where nvidia-cudnn-frontend is "
                        "installed)")
    p.add_argument("--policy", choices=("wr", "wd", "undivided"), default=None,
                   help="wr: per-kernel limit (default); wd: whole-network budget "
                        "(default when UCUDNN_TOTAL_WORKSPACE_SIZE is set); undivided: cuDNN alone")
    p.add_argument("--workspace-limit", default=None, metavar="SIZE",
                   help="per-kernel workspace limit, e.g. 64MiB (default: UCUDNN_DEFAULT_WORKSPACE_LIMIT or 64MiB)")
    p.add_argument("--total-workspace", default=None, metavar="SIZE",
                   help="whole-network workspace budget for --policy wd (default: UCUDNN_TOTAL_WORKSPACE_SIZE)")
    p.add_argument("--batch-policy", default=None, metavar="POLICY",
                   help=" | ".join(BATCH_POLICIES) + " (default: UCUDNN_BATCH_SIZE_POLICY or powerOfTwoAndEvenSplits)")
    p.add_argument("--unwritten", action="store_true",
                   help="with --policy wr: a kernel may take a micro-batch's workspace from output its call has not "
                        "written yet (forward / backward data: the later samples' output; backward filter: its "
                        "layer's dx), marked workspace_from: unwritten; run such plans with beta 0 and give a "
                        "backward filter its dx (default: UCUDNN_UNWRITTEN)")
    p.add_argument("--compare", action="store_true",
                   help="also plan WD, WR and undivided at the same memory (WD: the total; WR, undivided: the "
                        "per-kernel limit, default total / number of kernels) and report them side by side")
    p.add_argument("--inference", action="store_true",
                   help="with --network: plan the whole forward pass for inference (issue 19; a whole-graph spec "
                        "such as squeezenet1_1 or mobilenet_v2): measures on this GPU every conv's WR plan under "
                        "--workspace-limit (default 8MiB here), every fusable block fused, every node and layout "
                        "transform, then chooses per block fused or per layer and per layer the layout "
                        "(--layout: the input's, default NCHW); writes ucudnn-inference-plan/1")
    p.add_argument("--from-plan", metavar="PLAN.json",
                   help="with --inference: re-plan from the costs an inference plan holds (no GPU), e.g. with "
                        "another --layout or --no-fuse")
    p.add_argument("--no-fuse", action="store_true", help="with --inference: run every layer on its own")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (ucudnn-plan/1)")
    p.add_argument("-o", "--out", metavar="PLAN.json", help="also write the plan JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    batch_policy = args.batch_policy or config.batch_policy()
    if args.inference or args.from_plan:
        return _inference(args, batch_policy)
    if args.sources is not None and (args.tables or not args.network):
        raise InputError("only applies when --network is benchmarked (without --from-table)", "--sources")
    if args.network and not args.tables:
        table = _measure(args, batch_policy)
    else:
        table = BenchmarkTable.merge([BenchmarkTable.load(t) for t in (args.tables or [DEFAULT_TABLE])])
        if args.network:
            from ..planning.network import load_network

            table = load_network(args.network).table_from(table, args.batch, args.dtype, args.layout)
    total = args.total_workspace or config.total_workspace_size()
    policy = args.policy or ("wd" if args.total_workspace or config.total_workspace_size() else "wr")
    result = make_plan(table, policy,
                       workspace_limit=args.workspace_limit or config.default_workspace_limit(),
                       total_workspace=total,
                       batch_policy=batch_policy,
                       unwritten=args.unwritten or (policy == "wr" and config.unwritten()),
                       host_ties=config.host_ties())
    summary = None
    if args.compare:
        from ..planning.wd import compare_policies, comparison_summary
        from ..units import parse_size

        # the plan above fixes the memory: WD's total, or WR's / undivided's per-kernel limit
        comparison = compare_policies(
            table, batch_policy,
            total_workspace=result.total_workspace if result.total_workspace is not None else None,
            workspace_limit=(parse_size(args.workspace_limit, "workspace_limit") if args.workspace_limit
                             else result.workspace_limit))
        summary = comparison_summary(comparison)
    doc = result.to_dict()
    if summary is not None:
        doc["compare"] = summary
    if args.out:
        with open(args.out, "w") as f:
            f.write(result.to_json(indent=1) + "\n")
    if args.json:
        from ._output import print_json

        print_json(doc)
    else:
        from ._output import print_compare, print_plan

        print_plan(result)
        if summary is not None:
            print_compare(summary)
    return 0


def _measure(args: argparse.Namespace, batch_policy: str) -> BenchmarkTable:
    """Benchmark ``--network`` on this GPU (raises GpuUnavailable without one: exit code 4)."""
    from ..measure.benchmarking import benchmark
    from ..planning.network import load_network
    from .bench import _sources

    kernels = load_network(args.network).kernels(args.batch, args.dtype or "float32", args.layout or "NCHW")
    table = benchmark(kernels, batch_policy, sources=_sources(args.sources, None))
    if args.save_table:
        table.save(args.save_table)
    return table


def _inference(args: argparse.Namespace, batch_policy: str) -> int:
    """``ucudnn plan --network squeezenet1_1 --inference --batch 1 --workspace-limit 8MiB`` (GPU), or
    ``--inference --from-plan P.json`` (re-planned from its costs, no GPU)."""
    import json
    import sys

    if args.tables:
        raise InputError("inference plans are measured on the GPU (or re-planned --from-plan), not from training "
                         "tables", "--from-table")
    for flag, v in (("--policy", args.policy), ("--total-workspace", args.total_workspace),
                    ("--compare", args.compare or None), ("--save-table", args.save_table)):
        if v is not None:
            raise InputError("does not apply to inference plans", flag)
    if args.from_plan:
        from ..planning.inference import load_plan, replan

        doc = replan(load_plan(args.from_plan), fuse=not args.no_fuse,
                     **({"input_layout": args.layout} if args.layout else {}))
    else:
        if not args.network:
            raise InputError("--inference needs --network (a whole-graph spec) or --from-plan", "--network")
        if args.dtype == "bfloat16":
            raise InputError("inference plans run float32 or float16", "--dtype")
        from ..inference import plan_inference
        from .bench import _sources

        doc = plan_inference(args.network, args.batch, args.dtype or "float32",
                             workspace_limit=args.workspace_limit or "8MiB", input_layout=args.layout or "NCHW",
                             sources=_sources(args.sources, None), batch_policy=batch_policy,
                             fuse=not args.no_fuse, log=lambda m: print(m, file=sys.stderr))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    if args.json:
        from ._output import print_json

        print_json(doc)
    else:
        from ._output import print_inference_plan

        print_inference_plan(doc)
    return 0
