"""Schema migrations of the ucudnn store (Alembic), applied by :meth:`ucudnn.catalog.store.Store.migrate`.

Why Alembic: a cluster's PostgreSQL store outlives server versions, and the
library's SQLite cache outlives package upgrades; each schema change is one
revision file under ``versions/`` so any older store opens with newer code.

Revisions:

* ``0001`` — the v1 schema (benchmark_tables, plans, kernel_benches) as the
  first release created it with ``create_all`` (no ``alembic_version`` table).
  Such stores are recognised and stamped ``0001`` before upgrading.
* ``0002`` — plan workspace sizes become 64-bit (PostgreSQL ``INTEGER`` is
  32-bit; workspaces exceed 2 GiB) and the ``jobs`` table of the service.
* ``0003`` — ``plans.batch_policy`` becomes VARCHAR(32) on PostgreSQL: the
  ``powerOfTwoAndMidpoints`` / ``powerOfTwoAndEvenSplits`` names are longer than 16.

Opening a store that is already at :data:`HEAD` costs one small query and
does not import Alembic.  Revisions are written by hand (``alembic revision``
is not needed): copy the latest file and bump ``revision``/``down_revision``.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

HEAD = "0003"
V1_TABLES = {"benchmark_tables", "plans", "kernel_benches"}
_PG_LOCK_KEY = 0x75637564  # "ucud": serialises migrations of one PostgreSQL store across processes
_local_lock = threading.Lock()
_RETRIES = 10   # about 2.75 s of back-off in all: a concurrent migration takes well under a second


def current_revision(conn: Connection) -> str | None:
    """The store's revision: ``alembic_version``'s row, ``"0001"`` for an unstamped v1 store, None if empty."""
    names = set(inspect(conn).get_table_names())
    if "alembic_version" in names:
        row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
        if row is not None:
            return str(row[0])
    if V1_TABLES <= names:
        return "0001"
    return None


def upgrade(engine: Engine) -> None:
    """Bring the store behind ``engine`` to :data:`HEAD`; safe to call from many threads and processes."""
    try:
        with engine.connect() as conn:
            if current_revision(conn) == HEAD:
                return
    except Exception:  # noqa: BLE001 - e.g. a locked SQLite file: fall through to the locked path
        pass
    with _local_lock:
        for attempt in range(_RETRIES):
            try:
                _upgrade_locked(engine)
                return
            except Exception:
                # Another process may be migrating the same store (SQLite has no advisory locks): its DDL can
                # land between our inspection and ours ("table ... already exists").  Our transaction rolled
                # back, so once that process has committed the store is at HEAD (success) or we try again;
                # a store that never gets there is a real error.
                with engine.connect() as conn:
                    if current_revision(conn) == HEAD:
                        return
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))


def _upgrade_locked(engine: Engine) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        cfg.attributes["connection"] = conn
        names = set(inspect(conn).get_table_names())
        if "alembic_version" not in names and V1_TABLES <= names:
            command.stamp(cfg, "0001")  # a store made by the first release
        command.upgrade(cfg, "head")
