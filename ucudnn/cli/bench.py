"""``ucudnn bench``: measure kernels on this machine's GPU and write a benchmark table."""
from __future__ import annotations

import argparse
import sys

from .. import config
from ..errors import InputError
from ..measure.sources.base import DEFAULT_REPEAT
from ..policy import POLICIES as BATCH_POLICIES
from ..problem import OPS, ConvProblem, KernelSpec


def parse_problem(text: str, batch: int | None, dtype: str, layout: str) -> ConvProblem:
    """``n=256,c=96,h=27,w=27,k=256,r=5,s=5,pad=2,stride=1`` -> ConvProblem."""
    fields: dict = {"dtype": dtype, "layout": layout}
    for part in text.split(","):
        if "=" not in part:
            raise InputError(f"expected key=value pairs, got {part!r}", "--problem")
        key, value = (x.strip() for x in part.split("=", 1))
        if key in ("pad", "stride", "dilation"):
            nums = [int(v) for v in value.replace("x", ":").split(":")]
            fields[key] = (nums[0], nums[-1])
        elif key in ("dtype", "layout"):
            fields[key] = value
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                raise InputError(f"{key} must be an integer, got {value!r}", "--problem") from None
    if batch is not None:
        fields["n"] = batch
    if fields.get("h") and "w" not in fields:
        fields["w"] = fields["h"]
    if fields.get("r") and "s" not in fields:
        fields["s"] = fields["r"]
    return ConvProblem.from_dict(fields, "--problem")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark convolution kernels on this GPU and write a benchmark table",
                       description="Measure every cuDNN algorithm and math type at every micro-batch size the "
                                   "batch policy names; write ucudnn-benchmark-table/1 JSON.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--network", help="a shipped network (alexnet, resnet50, ...) or a network JSON file")
    what.add_argument("--problem", action="append", help="n=256,c=96,h=27,w=27,k=256,r=5,s=5,pad=2,stride=1 (repeatable)")
    p.add_argument("--batch", type=int, help="mini-batch size (default: the network's)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC"))
    p.add_argument("--numerics", default=None, help="strict | tf32 | default, optionally -deterministic "
                                                     "(default: strict for float32, default otherwise)")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of forward,backward_data,backward_filter")
    p.add_argument("--batch-policy", default=None, help=" | ".join(BATCH_POLICIES))
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT,
                   help=f"timed samples per configuration, median kept (default {DEFAULT_REPEAT}; 0: cuDNN Find's time)")
    p.add_argument("--max-workspace", default=None, help="largest workspace offered while benchmarking (default min(4GiB, free/4))")
    p.add_argument("--sources", default=None, help="comma-separated algorithm sources: legacy (cudnnFind*), "
                   "graph (cuDNN graph-API engines; needs ucudnn[graph]), relayout (the other sources named, run in the "
                   "other layout through ucudnn's transform kernels), fold (the other sources named, run on strided "
                   "first layers folded into stride-1 convolutions by ucudnn's fold kernels) (default: UCUDNN_SOURCES, else "
                   "legacy,graph,depthwise,fold where nvidia-cudnn-frontend is installed, legacy,depthwise,fold "
                   "otherwise; depthwise: ucudnn's depthwise K x K kernels, declining other layers at no cost)")
    p.add_argument("--graph-top-k", type=int, default=None, help="graph source: time only the first K engine "
                   "configurations (heuristic order) that build at each micro-batch size (default: 12)")
    p.add_argument("--timing", default="eager", choices=("eager", "replay"), help="eager: each configuration "
                   "called back to back from Python, as plans run by default; replay: captured into a CUDA graph and "
                   "replayed, for plans you capture (GPU time without the host's launch work)")
    p.add_argument("--channel-policy", default=None, help="also measure slices of each kernel's output channels "
                   "(issue 18): none | halves (k/2, k/4, k/8) | powerOfTwo (default: UCUDNN_CHANNEL_POLICY, else "
                   "none); the planners cover k with them "
                   "where that is faster under a limit (legacy and graph sources; about 4x the benchmark for halves)")
    p.add_argument("-o", "--out", required=True, help="where to write the table (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..measure.benchmarking import benchmark
    from ..policy import normalize_channel_policy
    from ..units import parse_size

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            raise InputError(f"unknown op {o!r}", "--ops")
    if args.network:
        from ..planning.network import load_network

        kernels = load_network(args.network).kernels(args.batch, args.dtype, args.layout, ops)
    else:
        kernels = []
        for i, text in enumerate(args.problem):
            prob = parse_problem(text, args.batch, args.dtype, args.layout)
            kernels += [KernelSpec(f"problem{i}/{op}", op, prob) for op in ops]
    sources = _sources(args.sources, args.graph_top_k)
    table = benchmark(kernels, args.batch_policy or config.batch_policy(), args.numerics, sources=sources,
                      repeat=args.repeat,
                      max_workspace=parse_size(args.max_workspace) if args.max_workspace else None,
                      timing=args.timing,
                      channel_policy=None if args.channel_policy is None
                      else normalize_channel_policy(args.channel_policy, "--channel-policy"))
    table.save(args.out)
    n = sum(len(k.measurements) for k in table.kernels)
    print(f"wrote {args.out}: {len(table.kernels)} kernels, {n} measurements on {table.device}, "
          f"cuDNN {table.cudnn_version}", file=sys.stderr)
    return 0


def _sources(names: str | None, graph_top_k: int | None) -> list:
    """``--sources`` names (None: the defaults) -> source instances (``--graph-top-k`` configures a graph source
    of its own)."""
    from .. import source_names
    from ..measure.benchmarking import resolve_sources

    wanted = list(source_names.canonical(names, "--sources"))
    if graph_top_k is not None:
        if graph_top_k < 1:
            raise InputError(f"must be a positive integer, got {graph_top_k}", "--graph-top-k")
        if "graph" not in wanted:
            raise InputError("only applies with --sources ...,graph", "--graph-top-k")
        # registered before resolving, so a relayout source wraps this very instance
        from ..measure.sources import registry
        from ..measure.sources.graph import GraphSource

        registry.register(GraphSource(top_k=graph_top_k))
    try:
        sources = resolve_sources(wanted)
    except InputError as e:
        raise InputError(str(e).split(": ", 1)[-1], "--sources") from None
    return sources
