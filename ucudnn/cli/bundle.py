"""``ucudnn bundle export|import|list``: portable plan bundles (a SQLite store file).

    ucudnn bundle export h100.bundle --store postgresql+psycopg://... --device H100 --cudnn-version 91900
    ucudnn bundle import h100.bundle [--store URL]      # default: the user cache
    ucudnn bundle list h100.bundle --json               # one entry per stored plan
"""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="export, import and list plan bundles (portable SQLite files)",
                       description="A bundle holds benchmark tables, kernel measurements and plans for one or more "
                                   "(GPU model, cuDNN version). The library reads installed bundles before it "
                                   "benchmarks (system directory, then UCUDNN_BUNDLE_PATH).")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ex = verbs.add_parser("export", help="copy a store's rows into a bundle file")
    ex.add_argument("bundle", metavar="OUT.bundle")
    ex.add_argument("--store", metavar="URL", help="the store to export (default: the user cache)")
    ex.add_argument("--device", action="append", metavar="MODEL",
                    help="only this GPU model (H100) or device name (repeatable)")
    ex.add_argument("--cudnn-version", action="append", type=int, metavar="V", help="only this cuDNN version (repeatable)")
    ex.set_defaults(func=run_export)

    im = verbs.add_parser("import", help="copy a bundle's rows into a store (idempotent)")
    im.add_argument("bundle", metavar="B.bundle")
    im.add_argument("--store", metavar="URL", help="the store to import into (default: the user cache)")
    im.set_defaults(func=run_import)

    ls = verbs.add_parser("list", help="the plans a bundle holds")
    ls.add_argument("bundle", metavar="B.bundle")
    ls.add_argument("--json", action="store_true", help="a JSON list, one entry per plan")
    ls.set_defaults(func=run_list)


def run_export(args: argparse.Namespace) -> int:
    from ..catalog import bundle
    from ..catalog.store import Store
    from ._output import print_json

    counts = bundle.export(Store(args.store) if args.store else Store(), args.bundle, devices=args.device,
                           cudnn_versions=args.cudnn_version)
    print_json({"bundle": args.bundle, "added": counts, **bundle.summary(args.bundle)})
    return 0


def run_import(args: argparse.Namespace) -> int:
    from ..catalog import bundle
    from ..catalog.store import Store
    from ._output import print_json

    dst = Store(args.store) if args.store else Store()
    counts = bundle.import_bundle(args.bundle, dst)
    from ..cluster.precompute import safe_url

    print_json({"bundle": args.bundle, "store": safe_url(dst.url), "added": counts})
    return 0


def run_list(args: argparse.Namespace) -> int:
    from ..catalog import bundle

    plans = bundle.list_plans(args.bundle)
    if args.json:
        from ._output import print_json

        print_json(plans)
        return 0
    from rich.console import Console
    from rich.table import Table

    from ..cluster.engines.base import Target
    from ..units import format_size

    info = bundle.summary(args.bundle)
    con = Console()
    for t in info["targets"]:
        con.print(f"{t['device']} / cuDNN {t['cudnn_version']}: {t['benchmark_tables']} tables, "
                  f"{t['kernel_benches']} kernel measurements, {t['plans']} plans")
    tab = Table(title=f"plans in {args.bundle}", title_justify="left")
    for col in ("table", "policy", "limit", "batch policy", "numerics", "GPU", "cuDNN", "time ms"):
        tab.add_column(col, justify="right" if col in ("limit", "time ms") else "left")
    for p in plans:
        size = p["total_workspace"] if p["policy"] == "wd" else p["workspace_limit"]
        tab.add_row(f"{p['table_name'] or ''} {p['table'][:12]}", p["policy"],
                    ("total " if p["policy"] == "wd" else "") + format_size(size or 0), p["batch_policy"],
                    p["numerics"] or "",
                    Target(p["device"], p["cudnn_version"]).accelerator_type, str(p["cudnn_version"]),
                    f"{p['total_time_ms']:.3f}")
    con.print(tab)
    return 0
