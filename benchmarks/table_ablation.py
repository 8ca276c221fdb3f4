"""What a source (or one op of it) is worth in a recorded table: WR planned at each limit from the whole table and
from the same table without that source's rows (CPU only: planning is pure Python, the times are the table's).

A planned total is a prediction from measurements, not an execution: the executed totals of the same plans are in
the benchmark's own report (e.g. ``channel_wr_*.md``).  Use it to see which part of a source the plans rely on.

    python benchmarks/table_ablation.py --table benchmarks/results/X.table.json.gz --drop winograd:backward_filter \\
        --drop winograd --limits 64MiB,4GiB

``--max-chunks N[,N...]`` plans without the winograd rows whose call runs more than N chunks (what
``ucudnn.measure.sources.winograd.MAX_CHUNKS`` leaves unmeasured), and reports the recorded time of the rows left out.

``--drop winograd:slices`` plans once more without the winograd source's input-channel slices (``-s2`` / ``-s4``
rows); ``winograd:streams`` without its chunks over streams (``-p2`` / ``-p3``), ``winograd:groups`` without its
point groups (``-gG``; ``winograd:groups:forward`` those of one op only), ``winograd:ksplit`` without its split
reductions (``-kS``): the spelling ``channel_wr.py --without`` takes.  ``--drop channels`` plans without the
channel-slice rows a channel policy measured (batch splits only).  ``--drop-slices`` / ``--drop-streams`` /
``--drop-groups`` are the same as those three.

``--offered`` plans once more with only the winograd point-group rows the source offers now
(:func:`ucudnn.measure.sources.winograd.point_groups`): what a narrower offering rule costs a table recorded
before it.

``--scale SOURCE[:OP][@H]=F`` (repeatable) asks what a faster (or slower) source would be worth: the rows ``--drop
SOURCE[:OP]`` would leave out (of kernels whose input is ``H`` pixels high only) cost ``F`` times their recorded time,
and WR is planned again at every limit (issue 18: a Winograd F(5x5, 3x3) for AlexNet's 13x13 layers priced as
``winograd@13=0.8``, faster FFT transforms as ``fft=0.5``).  A what-if on times alone: workspace stays as recorded.

``--chunk-penalty A[,A...]`` asks what the winograd source's chunking costs the plans: each chunked winograd row
(``wino-f4-cN`` / ``-tN``) slower than the one-chunk row (``wino-f4``) of the same kernel and micro-batch is set to
``one_chunk + A * (chunked - one_chunk)`` (A = 1: as measured; 0: chunking free), and WR is planned again.  The
fraction of the unbounded plan (issue 18's bar) is reported beside each.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from own_sources import chain, source_variant  # noqa: E402


def dropper(spec: str):
    """``source`` or ``source:op``: a keep(kernel, measurement) predicate leaving out the rows that run that source
    (itself or inside a wrapper: :func:`own_sources.chain`), of every op or of ``op`` only; ``source:variant``
    (``winograd:groups``, ...: :func:`own_sources.source_variant`) the rows that run that variant."""
    variant = source_variant(spec)
    if variant is not None:
        return variant
    if spec == "channels":   # the channel-slice rows (a channel policy's), whatever their source
        return lambda k, m: m.channels is None
    source, _, op = spec.partition(":")
    return lambda k, m: not (source in chain(m) and (not op or k.op == op))


def scaled(table, spec: str):
    """A copy of ``table`` whose rows matching ``SOURCE[:OP][@H]`` (of ``spec`` ``SOURCE[:OP][@H]=F``) cost ``F`` times
    their recorded time (``--scale``)."""
    import copy
    import dataclasses

    what, _, factor = spec.partition("=")
    if not factor:
        raise SystemExit(f"--scale wants SOURCE[:OP][@H]=FACTOR, got {spec!r}")
    what, _, height = what.partition("@")
    keep, f = dropper(what), float(factor)    # the rows --drop would leave out are the ones scaled
    out = copy.deepcopy(table)
    for k in out.kernels:
        if height and k.problem.h != int(height):
            continue
        k.measurements = [m if keep(k, m) else dataclasses.replace(m, time_ms=m.time_ms * f)
                          for m in k.measurements]
    return out


def offered(k, m) -> bool:
    """Whether the winograd source as it is now would measure recorded row ``m`` of kernel ``k`` with its point
    groups (:func:`ucudnn.measure.sources.winograd.point_groups` on the row's tiles, streams and slices): a
    recorded table re-planned with ``--offered`` shows what a narrower offering rule costs the plans."""
    from ucudnn.kernels.winograd import Geometry
    from ucudnn.measure.sources.winograd import chunk_of, csplit_of, groups_of, point_groups, streams_of, tiles_of

    if m.source != "winograd" or groups_of(m) == 1:
        return True
    geo = Geometry.of(k.problem.with_batch(m.micro_batch), k.op)
    tiles = tiles_of(m)
    if tiles is None:   # image chunks: the source's own reading of the row (its extra, else its name)
        tiles = chunk_of(m, m.micro_batch) * geo.tiles_per_image
    return groups_of(m) in point_groups(geo, k.op, tiles, streams_of(m), csplit_of(m))


def chunks(m) -> int:
    """The chunks a recorded winograd row's call runs (``extra.winograd.chunks``; 1 for other rows)."""
    return int(((m.extra or {}).get("winograd") or {}).get("chunks", 1))


def chunk_penalty(table, factor: float):
    """A copy of ``table`` whose chunked winograd rows (not the fused kernel's: it runs no chunks) cost ``factor`` of their penalty over the one-chunk row of the
    same kernel and micro-batch (rows without a one-chunk twin, and rows faster than it, are kept)."""
    import copy
    import dataclasses

    from ucudnn.measure.sources.winograd import ALGO, is_fused

    out = copy.deepcopy(table)
    for k in out.kernels:
        one = {m.micro_batch: m.time_ms for m in k.measurements if m.source == "winograd" and m.algo == ALGO}
        for i, m in enumerate(k.measurements):
            ref = one.get(m.micro_batch)
            if (m.source == "winograd" and m.algo != ALGO and not is_fused(m) and ref is not None
                    and ref < m.time_ms):
                k.measurements[i] = dataclasses.replace(m, time_ms=ref + factor * (m.time_ms - ref))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", action="append", required=True, help="a recorded table (repeatable)")
    ap.add_argument("--drop", action="append", default=[], help="source or source:op (repeatable)")
    ap.add_argument("--limits", default="64MiB,4GiB")
    ap.add_argument("--chunk-penalty", default=None, help="comma-separated factors A (see the module doc)")
    ap.add_argument("--scale", action="append", default=[], metavar="SOURCE[:OP][@H]=F",
                    help="also plan with those rows at F times their time (repeatable; see the module doc)")
    ap.add_argument("--max-chunks", default=None,
                    help="comma-separated N: also plan without the winograd rows whose call runs over N chunks")
    ap.add_argument("--drop-slices", action="store_true",
                    help="also plan without the winograd source's input-channel slices (rows -s2 / -s4)")
    ap.add_argument("--drop-streams", action="store_true",
                    help="also plan without the winograd source's chunks over streams (rows -p2 / -p3)")
    ap.add_argument("--drop-groups", action="store_true",
                    help="also plan without the winograd source's point groups (rows -g2 / -g3 / -g4)")
    ap.add_argument("--offered", action="store_true",
                    help="also plan with only the winograd point-group rows the source offers now")
    ap.add_argument("--out", default=None, help="write <out>/<--name>.json and .md")
    ap.add_argument("--name", default="table_ablation")
    args = ap.parse_args()

    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    limits = args.limits.split(",")
    rows = []
    for path in args.table:
        table = BenchmarkTable.load(path)
        drops = args.drop + [f"winograd:{name}" for name, on in (("slices", args.drop_slices),
                                                                   ("streams", args.drop_streams),
                                                                   ("groups", args.drop_groups)) if on]
        variants = [("all rows", table)] + [(f"without {d}", table.filtered(dropper(d))) for d in drops]
        if args.offered:
            variants.append(("point groups as offered now", table.filtered(offered)))
        for mx in (int(v) for v in args.max_chunks.split(",")) if args.max_chunks else ():
            variants.append((f"winograd calls of at most {mx} chunks", table.filtered(lambda k, m, mx=mx: chunks(m) <= mx)))
        variants += [(f"rows of {spec.partition('=')[0]} at x{spec.partition('=')[2]}", scaled(table, spec))
                     for spec in args.scale]
        if args.chunk_penalty:
            variants += [(f"winograd chunk penalty x{a}", chunk_penalty(table, float(a)))
                         for a in args.chunk_penalty.split(",")]
        for label, t in variants:
            planned = {lim: round(plan(t, "wr", workspace_limit=lim).total_time_ms, 3) for lim in limits}
            row = {"table": Path(path).name, "device": table.device, "rows": label, "planned_ms": planned,
                   # what timing those rows cost, one sample each: the recorded times of its winograd rows
                   "winograd_rows_ms": round(sum(m.time_ms for k in t.kernels for m in k.measurements
                                                 if m.source == "winograd"), 1)}
            if len(limits) > 1:   # the first limit's plan as a fraction of the last's (issue 18: 64 MiB / unbounded)
                row["fraction_first_of_last"] = round(planned[limits[-1]] / planned[limits[0]], 3)
            rows.append(row)
            print(f"{Path(path).name} | {label} | " + " | ".join(f"{lim} {v}" for lim, v in planned.items())
                  + (f" | fraction {row['fraction_first_of_last']}" if "fraction_first_of_last" in row else ""))
    if args.out:
        doc = {"provenance": provenance(), "limits": limits, "rows": rows}
        md = [md_header("WR planned from recorded tables, with and without rows of a source", doc["provenance"]),
              "Planned (predicted) ms from the tables' measurements, WR at each limit per kernel (planning runs on "
              "the CPU; the device is the table's).", "",
              (f"Fraction: {limits[0]}'s planned ms as a fraction of {limits[-1]}'s (unbounded / limited; issue 18's "
               "bar 0.9 at 64 MiB against 4 GiB)."), "",
              ("Winograd rows: the recorded ms of the table's winograd rows summed (one sample of each: a proxy for "
               "what measuring them costs)."), "",
              "| table | device | rows | " + " | ".join(limits) + " | fraction | winograd rows ms |",
              "|---|---|---|" + "---:|" * (len(limits) + 2)]
        md += [f"| {r['table']} | {r['device']} | {r['rows']} | "
               + " | ".join(str(r["planned_ms"][lim]) for lim in limits) + f" | {r.get('fraction_first_of_last', '-')} |"
               + f" {r['winograd_rows_ms']} |" for r in rows]
        write(args.out, args.name, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
