"""``ucudnn precompute``: measure every unit a cluster's networks need once, plan them, store or bundle the result.

Prints the job's JSON summary on stdout (progress goes to stderr).  Exit 0
when every unit was measured and every feasible plan made; 1 when the job
finished with failed units (listed in ``failed_units`` with their reasons);
2 bad input; 4 no GPU where measuring needs one.
"""
from __future__ import annotations

import argparse
import sys

from ..policy import POLICIES as BATCH_POLICIES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "precompute", help="benchmark and plan networks for every GPU model of a cluster (local GPUs or Ray)",
        description="Split networks (or recorded tables) into units (GPU model, cuDNN version, problem, op), "
                    "measure each unit once (duplicates removed, units already stored skipped: a killed job "
                    "resumes), then plan every table with WR under each --workspace-limits and WD under each "
                    "--total-workspaces. Prints a JSON summary.")
    p.add_argument("--job", metavar="JOB.yaml", help="a job file (YAML or JSON; schema precompute-job.schema.json); "
                                                   "flags override its fields")
    p.add_argument("--network", action="append", metavar="NAME[@B,...]",
                   help="a shipped network (alexnet, resnet50, ...) or a ucudnn-network/1 file, optionally with "
                        "batch sizes: resnet50@64,128 (repeatable)")
    p.add_argument("--torch-model", dest="torch_models", action="append", metavar="MODULE:FACTORY[@B,...]",
                   help="a PyTorch model to precompute, e.g. torchvision.models:resnet50@128: the factory is called "
                        "with no arguments and its Conv2d layers traced on CPU at --input-shape, then treated like "
                        "a --network (torch extra; batch sizes after @ or from --batch; repeatable)")
    p.add_argument("--input-shape", metavar="C,H,W",
                   help="with --torch-model: the shape of one input sample, e.g. 3,224,224")
    p.add_argument("--from-table", dest="tables", action="append", metavar="T.json",
                   help="a recorded benchmark table ('builtin:NAME' for a shipped one): replayed instead of "
                        "measured, no GPU needed; planned as it is unless --network is given (repeatable)")
    p.add_argument("--batch", metavar="B[,B...]", help="batch sizes of networks that name none")
    p.add_argument("--dtype", metavar="D[,D...]", help="float32,float16,bfloat16 (default float32)")
    p.add_argument("--layout", metavar="L[,L...]", help="NCHW,NHWC (default NCHW)")
    p.add_argument("--numerics", metavar="N[,N...]",
                   help="strict | tf32 | default[-deterministic] (default: strict for float32, default otherwise)")
    p.add_argument("--ops", metavar="OP[,OP...]", help="subset of forward,backward_data,backward_filter")
    p.add_argument("--batch-policy", metavar="POLICY",
                   help=" | ".join(BATCH_POLICIES) + " (default powerOfTwoAndEvenSplits, the library's: what jobs "
                   "plan with where UCUDNN_BATCH_SIZE_POLICY is unset; at a power-of-two batch its plans answer the "
                   "plan service's powerOfTwo requests)")
    p.add_argument("--workspace-limits", metavar="SIZE[,SIZE...]", help="per-kernel limits to plan with WR, e.g. 8MiB,64MiB")
    p.add_argument("--total-workspaces", metavar="SIZE[,SIZE...]", help="whole-table budgets to plan with WD, e.g. 1GiB")
    p.add_argument("--gpu-models", metavar="M[,M...]", help="only these GPU models (H100, H200, or full device names)")
    p.add_argument("--repeat", type=int, default=None, help="timed samples per configuration (default 3; 0: Find's time)")
    p.add_argument("--sources", metavar="NAMES", default=None,
                   help="algorithm sources to measure networks with (legacy, graph, mec, direct, depthwise, winograd, "
                        "fft, relayout, fold; default: "
                        "UCUDNN_SOURCES, else legacy,graph,depthwise,fold where nvidia-cudnn-frontend is installed, "
                        "legacy,depthwise,fold otherwise); recorded tables keep the sources they were measured with")
    p.add_argument("--channel-policy", metavar="POLICY", default=None,
                   help="none | halves | powerOfTwo: also measure output-channel slices (default: "
                        "UCUDNN_CHANNEL_POLICY, else none) for networks; jobs that run with that policy find "
                        "these plans; recorded tables keep the policy they were measured with")
    p.add_argument("--max-retries", type=int, default=None,
                   help="further attempts of a failing unit before it is reported failed (default 2)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process per local GPU (UCUDNN_BENCHMARK_DEVICES); ray: a Ray cluster "
                        "(cluster extra), started locally when --address is not given")
    p.add_argument("--address", metavar="ADDR", help="join this Ray cluster (host:port, ray://..., or auto)")
    p.add_argument("--workers", type=int, default=None,
                   help="at most this many workers (GPUs; processes for recorded tables)")
    p.add_argument("--store", metavar="URL", help="store to read and write (SQLAlchemy URL or SQLite path); default: "
                                                 "the --out bundle, else the user cache")
    p.add_argument("--out", metavar="PLANS.bundle", help="write the job's tables, measurements and plans to this bundle")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..catalog import bundle
    from ..cluster.engines import make_engine
    from ..cluster.precompute import JobProgress, JobSpec, job_rows, merge_flags, open_store, print_summary, run_job

    spec = merge_flags(JobSpec.load(args.job) if args.job else None, args)
    store = open_store(args.store, args.out)
    writes_bundle_directly = args.out is not None and args.store is None
    engine = make_engine(args.engine, address=args.address, workers=args.workers, gpu_models=spec.gpu_models)
    progress = JobProgress(sys.stderr.isatty() if args.progress is None else args.progress)
    try:
        summary = run_job(spec, engine, store, progress=progress)
    finally:
        engine.close()
    for note in summary.get("notes", []):  # e.g. a recorded table without a numerics field: what it was taken as
        print(f"ucudnn precompute: {note}", file=sys.stderr)
    if args.out:
        if writes_bundle_directly:
            store.engine.dispose()
            bundle.finalize(args.out)
        else:  # only this job's rows travel
            table_ids, bench_ids, plan_ids = job_rows(spec, summary, store)
            bundle.export(store, args.out, table_ids=table_ids, plan_ids=plan_ids, bench_ids=bench_ids)
        summary["bundle"] = str(Path(args.out))
    print_summary(summary)
    return 0 if summary["ok"] else 1

