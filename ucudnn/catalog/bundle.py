"""Plan bundles: a portable SQLite file of tables, kernel measurements and plans.

A bundle is a :class:`~ucudnn.catalog.store.Store` file (same schema, same keys), so
everything that reads a store reads a bundle, and moving results between a
cluster's store, a user cache and a plan service is a row copy:

    ucudnn bundle export h100.bundle --store postgresql+psycopg://... --device H100
    ucudnn bundle import h100.bundle                 # into the user cache (or --store URL)
    ucudnn bundle list h100.bundle --json

It may hold several (device model, cuDNN version) pairs; nothing in it is
ever used for another pair, because every key names both (the library's
lookup also skips, with a logged reason, any bundle that holds nothing for
the GPU it runs on: :mod:`ucudnn.catalog.lookup`).  Exported bundles use SQLite's
rollback journal, not WAL, so the file alone is complete and can be read in
a read-only directory.  Installed bundles (MIOpen's system database, layered
under the user's) live in :func:`system_bundle_dir` and ``UCUDNN_BUNDLE_PATH``.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, Iterable

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from ..errors import InputError
from ..planning.table import BenchmarkTable, effective_numerics
from .store import KernelBenchRow, PlanRow, Store, TableRow
from .target import Target

ROW_TYPES = (TableRow, KernelBenchRow, PlanRow)
BUNDLE_SUFFIXES = (".bundle", ".sqlite", ".db")


class BundleError(InputError):
    """A file that is not a readable ucudnn bundle (missing, not SQLite, another schema revision)."""


class BundleReader(Store):
    """A bundle opened read-only: the store's queries, no migrations, no writes.

    Installed bundles may sit in read-only system directories and must not be
    changed by reading them, so this skips :meth:`Store.migrate` and refuses a
    bundle of another schema revision (the reason says how to convert it).
    """

    def __init__(self, path: str | Path):  # noqa: D107 - deliberately not Store.__init__ (no migration, no WAL)
        from ucudnn.server.migrations import HEAD, current_revision

        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise BundleError(f"no such bundle file: {self.path}", "bundle")
        self.url = f"sqlite:///file:{self.path.resolve()}?mode=ro&uri=true"
        self.engine = create_engine(self.url)
        try:
            with self.engine.connect() as conn:
                rev = current_revision(conn)
        except Exception as e:  # noqa: BLE001 - sqlite3.DatabaseError: not a database, unreadable...
            self.engine.dispose()
            raise BundleError(f"{self.path} is not a ucudnn bundle: {e}", "bundle") from None
        if rev != HEAD:
            self.engine.dispose()
            raise BundleError(f"{self.path} has store schema revision {rev!r}, this ucudnn reads {HEAD!r}; "
                              "import it into a store (ucudnn bundle import) and export it again", "bundle")

    def migrate(self) -> None:  # never write to a bundle being read
        return None

    def targets(self) -> set[tuple[str, int]]:
        """Every (device, cuDNN version) the bundle holds something for."""
        return _targets_of(self)

    def close(self) -> None:
        self.engine.dispose()


def _table_numerics(values: dict[str, Any]) -> dict[str, Any]:
    """A table row as a bundle carries it: with the numerics its table is taken to have (``effective_numerics``).

    Tables stored without the field (``ucudnn-benchmark-table/1`` began without it) get it spelled out in
    the body and the ``numerics`` column, so whoever reads the bundle sees the numerics its plans were made
    under; the id is kept (plans refer to it).
    """
    if values.get("numerics") is None:
        table = BenchmarkTable.loads(values["body"]).resolved()
        values = {**values, "numerics": table.numerics, "body": table.to_json()}
    return values


def _copy_rows(src: Store, dst: Store, where: dict[type, Any],
               fix: dict[type, Any] | None = None) -> dict[str, int]:
    """Copy rows of each type matching ``where[type]`` (a SQLAlchemy filter or None); existing ids are kept.

    ``fix[type]``, where given, maps a row's column values to the values written.
    """
    counts: dict[str, int] = {}
    with Session(src.engine) as s_in, Session(dst.engine) as s_out:
        for cls in ROW_TYPES:
            q = select(cls)
            if where.get(cls) is not None:
                q = q.where(where[cls])
            cols = [c.key for c in cls.__table__.columns]
            n = 0
            for row in s_in.execute(q).scalars():
                if s_out.get(cls, row.id) is None:
                    values = {c: getattr(row, c) for c in cols}
                    if fix and cls in fix:
                        values = fix[cls](values)
                    s_out.add(cls(**values))
                    n += 1
            counts[cls.__tablename__] = n
        s_out.commit()
    return counts


def finalize(path: str | Path) -> None:
    """Fold the WAL into the file and switch to a rollback journal: one self-contained, read-only-safe file."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("VACUUM")
    finally:
        con.close()


def export(src: Store, out: str | Path, *, devices: Iterable[str] | None = None,
           cudnn_versions: Iterable[int] | None = None, table_ids: Iterable[str] | None = None,
           bench_ids: Iterable[str] | None = None, plan_ids: Iterable[str] | None = None) -> dict[str, int]:
    """Copy ``src``'s rows into the bundle ``out`` (created, or added to); returns rows added per kind.

    ``devices`` match a device name or its GPU model (``H100``); the id
    filters select exactly one job's rows (``ucudnn precompute --store URL --out B``).
    """
    out = Path(out).expanduser()
    wanted_dev = {d.lower() for d in devices} if devices else None
    pairs = {(d, int(v)) for d, v in _targets_of(src)}
    keep = {(d, v) for d, v in pairs
            if (wanted_dev is None or d.lower() in wanted_dev or Target(d, v).accelerator_type.lower() in wanted_dev)
            and (cudnn_versions is None or v in set(cudnn_versions))}
    dst = Store(out)
    where: dict[type, Any] = {}
    for cls, ids in ((TableRow, table_ids), (KernelBenchRow, bench_ids), (PlanRow, plan_ids)):
        conds = []
        if keep != pairs:
            conds.append(_pair_filter(cls, keep))
        if ids is not None:
            conds.append(cls.id.in_(list(ids)))
        where[cls] = _and(conds)
    try:
        counts = _copy_rows(src, dst, where, {TableRow: _table_numerics})
    finally:
        dst.engine.dispose()
    finalize(out)
    return counts


def import_bundle(bundle: str | Path, dst: Store) -> dict[str, int]:
    """Copy every row of ``bundle`` into ``dst`` (a user cache or a service's store); idempotent."""
    reader = BundleReader(bundle)
    try:
        return _copy_rows(reader, dst, {})
    finally:
        reader.close()


def list_plans(bundle: str | Path) -> list[dict[str, Any]]:
    """One entry per stored plan: its table (id, name, kernel count, numerics), policy, sizes, device, cuDNN, time.

    ``numerics`` is the numerics the plan's table is taken to have (``effective_numerics``: its own field,
    or, for a table stored without one, the rule for such tables).
    """
    reader = BundleReader(bundle)
    try:
        tables = {}
        with Session(reader.engine) as s:
            for tid, body in s.execute(select(TableRow.id, TableRow.body)):
                doc = json.loads(body)
                numerics = doc.get("numerics") or effective_numerics(BenchmarkTable.from_dict(doc)).numerics
                tables[tid] = {"name": doc.get("precompute") or doc.get("network"), "kernels": len(doc["kernels"]),
                               "numerics": numerics}
        out = []
        for p in reader.list_plans():
            t = tables.get(p["table_id"] or "", {})
            out.append({"id": p["id"], "table": p["table_id"], "table_name": t.get("name"),
                        "kernels": t.get("kernels"), "policy": p["policy"], "workspace_limit": p["workspace_limit"],
                        "total_workspace": p["total_workspace"], "batch_policy": p["batch_policy"],
                        "device": p["device"], "cudnn_version": p["cudnn_version"], "numerics": t.get("numerics"),
                        "total_time_ms": p["total_time_ms"]})
        return out
    finally:
        reader.close()


def summary(bundle: str | Path) -> dict[str, Any]:
    """Counts per (device, cuDNN version): what ``ucudnn bundle list`` prints for people."""
    reader = BundleReader(bundle)
    try:
        per: dict[tuple[str, int], dict[str, int]] = {}
        with Session(reader.engine) as s:
            for cls in ROW_TYPES:
                for d, v in s.execute(select(cls.device, cls.cudnn_version)):
                    per.setdefault((d, int(v)), {"benchmark_tables": 0, "kernel_benches": 0, "plans": 0})[
                        cls.__tablename__] += 1
        return {"path": str(reader.path), "targets": [{"device": d, "cudnn_version": v, **c}
                                                      for (d, v), c in sorted(per.items())]}
    finally:
        reader.close()


def system_bundle_dir() -> Path:
    """Where packages and images install bundles (``<prefix>/share/ucudnn/bundles``), read before the user's path."""
    return Path(sys.prefix) / "share" / "ucudnn" / "bundles"


def installed_bundles(system_dir: Path | None = None) -> list[Path]:
    """Bundle files of the system directory, then of ``UCUDNN_BUNDLE_PATH`` (files, or directories of them).

    Later entries are consulted later; a path that does not exist is left out
    (the lookup logs nothing for a directory nobody created).
    """
    from ..config import bundle_paths

    out: list[Path] = []
    for entry in [system_dir if system_dir is not None else system_bundle_dir(), *bundle_paths()]:
        if entry.is_dir():
            out += sorted(p for p in entry.iterdir() if p.suffix in BUNDLE_SUFFIXES and p.is_file())
        elif entry.is_file():
            out.append(entry)
    return out


def _targets_of(store: Store) -> set[tuple[str, int]]:
    """Every (device, cuDNN version) a store holds a table, a measurement or a plan for."""
    out: set[tuple[str, int]] = set()
    with Session(store.engine) as s:
        for cls in ROW_TYPES:
            out |= {(d, int(v)) for d, v in s.execute(select(cls.device, cls.cudnn_version).distinct())}
    return out


def _pair_filter(cls: Any, pairs: set[tuple[str, int]]) -> Any:
    from sqlalchemy import and_, false, or_

    if not pairs:
        return false()
    return or_(*(and_(cls.device == d, cls.cudnn_version == v) for d, v in pairs))


def _and(conds: list[Any]) -> Any:
    from sqlalchemy import and_

    return and_(*conds) if conds else None
