"""``ucudnn serve``: run the plan service (FastAPI under uvicorn).

    ucudnn serve --host 127.0.0.1 --port 8787 --store sqlite:////srv/ucudnn/plans.sqlite
    ucudnn serve --host 0.0.0.0 --port 8787 --store postgresql+psycopg://ucudnn@db/ucudnn   # a cluster's store

Binds to loopback unless told otherwise: exposing the service is a decision.
Set ``UCUDNN_API_TOKEN`` before exposing it (writes then need the token).
"""
from __future__ import annotations

import argparse
import gc
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the plan service over HTTP (FastAPI + uvicorn)",
                       description="Serve plans over HTTP (OpenAPI at /docs and /openapi.json). Writes need "
                                   "'Authorization: Bearer $UCUDNN_API_TOKEN' when that variable is set.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    p.add_argument("--store", default=None, metavar="URL",
                   help="SQLAlchemy URL of the store: sqlite:///path (WAL mode) or postgresql+psycopg://... "
                        "(default: SQLite in the user data directory)")
    p.add_argument("--open-plans", action="store_true",
                   help="let clients without the token plan stored tables (POST /v1/plans with table_id)")
    p.add_argument("--max-body", default="16MiB", metavar="SIZE", help="largest request body (default 16MiB)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--access-log", action="store_true", help="log every request (off by default: it costs throughput)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ucudnn.server.app import create_app, default_store_url

    from ..units import parse_size

    store = args.store or default_store_url()
    app = create_app(store, open_plans=args.open_plans, max_body_bytes=parse_size(args.max_body, "--max-body"))
    auth = "token required for writes" if app.state.ucudnn.api_token else "NO token (UCUDNN_API_TOKEN unset)"
    print(f"ucudnn serve: http://{args.host}:{args.port}  store {app.state.ucudnn.store.engine.url!r}  {auth}",
          file=sys.stderr, flush=True)
    # Everything allocated so far (FastAPI, pydantic, SQLAlchemy, Alembic...) lives as long as the process:
    # freezing it keeps the collector's full passes from scanning it every ~1000 requests (80+ ms stalls of
    # every connection at once, measured with benchmarks/load_plans.py before this line).
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    return 0
