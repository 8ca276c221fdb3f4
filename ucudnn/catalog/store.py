"""The durable store of benchmark tables, kernel measurements and plans (SQLAlchemy).

One store serves the library's on-disk cache (SQLite under the user cache
directory, or ``UCUDNN_DATABASE``), the plan service (``--store URL``:
SQLite or PostgreSQL) and plan bundles (a portable SQLite file).  Rows are
keyed by content hashes, so writing the same thing twice is a no-op.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Float, Integer, String, Text, create_engine, event, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..planning.plan import Plan
from ..planning.table import BenchmarkTable, KernelBench


class Base(DeclarativeBase):
    pass


class TableRow(Base):
    __tablename__ = "benchmark_tables"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    device: Mapped[str] = mapped_column(String(256), index=True)
    cudnn_version: Mapped[int] = mapped_column(Integer, index=True)
    numerics: Mapped[str | None] = mapped_column(String(64), nullable=True)
    kernels: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text)


class PlanRow(Base):
    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # hash of the request key
    key: Mapped[str] = mapped_column(Text)
    table_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    device: Mapped[str] = mapped_column(String(256), index=True)
    cudnn_version: Mapped[int] = mapped_column(Integer, index=True)
    policy: Mapped[str] = mapped_column(String(16))
    batch_policy: Mapped[str] = mapped_column(String(32))   # powerOfTwoAndEvenSplits: 23 (revision 0003)
    workspace_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # > 2 GiB happens
    total_workspace: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    total_time_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text)


class KernelBenchRow(Base):
    """Measurements of one (device, cuDNN, numerics, batch policy, problem, op): the library's benchmark cache."""

    __tablename__ = "kernel_benches"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    device: Mapped[str] = mapped_column(String(256), index=True)
    cudnn_version: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    body: Mapped[str] = mapped_column(Text)


class JobRow(Base):
    """A benchmark job of the plan service: its request, progress and, when done, the table it produced."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # queued | running | done | failed
    done: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    request: Mapped[str] = mapped_column(Text)
    table_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


JOB_COLUMNS = ("id", "status", "done", "total", "message", "table_id", "created_at", "updated_at")
MAX_INT32 = (1 << 31) - 1  # INTEGER columns are 32-bit on PostgreSQL


def key_id(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).expanduser()}"


class Store:
    """A handle on one database; cheap to keep, safe to share between threads."""

    def __init__(self, url: str | Path | None = None):
        if url is None:
            from ..config import database_path

            url = database_path()
        url = str(url)
        if "://" not in url:
            Path(url).expanduser().parent.mkdir(parents=True, exist_ok=True)
            url = sqlite_url(url)
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            @event.listens_for(self.engine, "connect")
            def _wal(dbapi_conn, _record):  # concurrent readers while one writes
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema up to date with the Alembic revisions in ``ucudnn.server.migrations``.

        A store made by an older version (including the first release, which had no
        version table) is upgraded in place; an up-to-date one costs one query.
        """
        from ucudnn.server.migrations import upgrade

        upgrade(self.engine)

    def _put(self, row: Base) -> None:
        with Session(self.engine) as s:
            if s.get(type(row), row.id) is not None:  # type: ignore[attr-defined]
                return
            s.add(row)
            try:
                s.commit()
            except IntegrityError:  # a concurrent writer stored the same content first
                s.rollback()

    # -- tables ----------------------------------------------------------------
    def put_table(self, table: BenchmarkTable) -> str:
        if not 0 <= table.cudnn_version <= MAX_INT32:
            from ..errors import TableError

            raise TableError(f"must be between 0 and {MAX_INT32}, got {table.cudnn_version}", "cudnn_version")
        tid = table.content_id()
        self._put(TableRow(id=tid, device=table.device, cudnn_version=table.cudnn_version, numerics=table.numerics,
                           kernels=len(table.kernels), created_at=time.time(), body=table.to_json()))
        return tid

    def get_table(self, table_id: str) -> BenchmarkTable | None:
        with Session(self.engine) as s:
            row = s.get(TableRow, table_id)
            return BenchmarkTable.loads(row.body) if row else None

    def list_tables(self, device: str | None = None, cudnn_version: int | None = None) -> list[dict[str, Any]]:
        q = select(TableRow.id, TableRow.device, TableRow.cudnn_version, TableRow.numerics, TableRow.kernels,
                   TableRow.created_at)
        if device is not None:
            q = q.where(TableRow.device == device)
        if cudnn_version is not None:
            q = q.where(TableRow.cudnn_version == cudnn_version)
        with Session(self.engine) as s:
            return [dict(r._mapping) for r in s.execute(q.order_by(TableRow.created_at))]

    # -- plans -----------------------------------------------------------------
    def put_plan(self, key: dict[str, Any], plan: Plan, table_id: str | None = None) -> str:
        pid = key_id(key)
        self._put(PlanRow(id=pid, key=json.dumps(key, sort_keys=True, default=str), table_id=table_id,
                          device=plan.device, cudnn_version=plan.cudnn_version, policy=plan.policy,
                          batch_policy=plan.batch_policy, workspace_limit=plan.workspace_limit,
                          total_workspace=plan.total_workspace, total_time_ms=plan.total_time_ms,
                          created_at=time.time(), body=plan.to_json()))
        return pid

    def get_plan(self, plan_id: str) -> Plan | None:
        with Session(self.engine) as s:
            row = s.get(PlanRow, plan_id)
            return Plan.from_dict(json.loads(row.body)) if row else None

    def get_plan_record(self, plan_id: str) -> tuple[str, str | None] | None:
        """(``ucudnn-plan/1`` text as stored, table id) of ``plan_id``: no parsing, the service answers the text."""
        with Session(self.engine) as s:
            row = s.execute(select(PlanRow.body, PlanRow.table_id).where(PlanRow.id == plan_id)).first()
            return (row[0], row[1]) if row else None

    def find_plan(self, key: dict[str, Any]) -> tuple[str, Plan] | None:
        pid = key_id(key)
        plan = self.get_plan(pid)
        return (pid, plan) if plan is not None else None

    def list_plans(self) -> list[dict[str, Any]]:
        q = select(PlanRow.id, PlanRow.table_id, PlanRow.device, PlanRow.cudnn_version, PlanRow.policy,
                   PlanRow.batch_policy, PlanRow.workspace_limit, PlanRow.total_workspace, PlanRow.total_time_ms,
                   PlanRow.key)
        with Session(self.engine) as s:
            return [dict(r._mapping) for r in s.execute(q.order_by(PlanRow.created_at))]

    # -- kernel measurements (the library's benchmark cache) ----------------------
    def put_kernel_bench(self, key: dict[str, Any], kb: KernelBench) -> None:
        self._put(KernelBenchRow(id=key_id(key), device=str(key.get("device", "")),
                                 cudnn_version=int(key.get("cudnn_version", 0)),
                                 key=json.dumps(key, sort_keys=True, default=str), created_at=time.time(),
                                 body=json.dumps(kb.to_dict())))

    def get_kernel_bench(self, key: dict[str, Any]) -> KernelBench | None:
        return self.get_kernel_bench_by_id(key_id(key))

    def kernel_bench_keys(self, device: str, cudnn_version: int, since: float | None = None) -> list[dict[str, Any]]:
        """The keys of every kernel's measurements held for this GPU model and cuDNN version (``since``: only those
        written at or after that time): what the lookup chain compares a missed key with
        (:mod:`ucudnn.catalog.near_keys`: why a bundle did not answer, the same kernel at a larger batch)."""
        q = select(KernelBenchRow.key).where(KernelBenchRow.device == device,
                                             KernelBenchRow.cudnn_version == int(cudnn_version))
        if since is not None:
            q = q.where(KernelBenchRow.created_at >= since)
        with Session(self.engine) as s:
            return [json.loads(k) for (k,) in s.execute(q)]

    def get_kernel_bench_by_id(self, bench_id: str) -> KernelBench | None:
        """By ``key_id(key)``: what the plan service answers nodes that computed the key themselves."""
        with Session(self.engine) as s:
            row = s.get(KernelBenchRow, bench_id)
            if row is None:
                return None
            d = json.loads(row.body)
        return KernelBench.from_dict(d)

    # -- benchmark jobs of the plan service ------------------------------------------
    def put_job(self, job_id: str, request: dict[str, Any], total: int) -> None:
        now = time.time()
        self._put(JobRow(id=job_id, status="queued", done=0, total=total, message=None,
                         request=json.dumps(request, sort_keys=True), table_id=None, created_at=now, updated_at=now))

    def update_job(self, job_id: str, **fields: Any) -> None:
        """Set ``status``/``done``/``message``/``table_id`` of a job."""
        with Session(self.engine) as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(updated_at=time.time(), **fields))
            s.commit()

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            if row is None:
                return None
            d = {c: getattr(row, c) for c in JOB_COLUMNS}
            d["request"] = json.loads(row.request)
            return d

    def fail_unfinished_jobs(self, reason: str) -> int:
        """Mark queued/running jobs failed (their thread died with the previous server process)."""
        with Session(self.engine) as s:
            n = s.execute(update(JobRow).where(JobRow.status.in_(("queued", "running")))
                          .values(status="failed", message=reason, updated_at=time.time())).rowcount
            s.commit()
            return int(n or 0)
