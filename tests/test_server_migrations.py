"""A store made by an older ucudnn opens with this one: its rows are kept and the schema is upgraded."""
from __future__ import annotations

import json
import time

import pytest
from server_kit import store_url, synthetic_table  # noqa: F401 (fixture)
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, Text, create_engine, inspect, text
from ucudnn.server.migrations import HEAD

from ucudnn.catalog.store import Store, key_id
from ucudnn.planning.plan import Plan
from ucudnn.planning.planner import plan as make_plan
from ucudnn.planning.table import BenchmarkTable


def create_v1_store(url: str) -> tuple[str, str]:
    """The first release's schema exactly (create_all, 32-bit sizes, no version table) with one table and plan."""
    md = MetaData()
    Table("benchmark_tables", md, Column("id", String(64), primary_key=True),
          Column("device", String(256), nullable=False, index=True),
          Column("cudnn_version", Integer, nullable=False, index=True), Column("numerics", String(64)),
          Column("kernels", Integer, nullable=False), Column("created_at", Float, nullable=False),
          Column("body", Text, nullable=False))
    Table("plans", md, Column("id", String(64), primary_key=True), Column("key", Text, nullable=False),
          Column("table_id", String(64), index=True), Column("device", String(256), nullable=False, index=True),
          Column("cudnn_version", Integer, nullable=False, index=True), Column("policy", String(16), nullable=False),
          Column("batch_policy", String(16), nullable=False), Column("workspace_limit", Integer),
          Column("total_workspace", Integer), Column("total_time_ms", Float, nullable=False),
          Column("created_at", Float, nullable=False), Column("body", Text, nullable=False))
    Table("kernel_benches", md, Column("id", String(64), primary_key=True),
          Column("device", String(256), nullable=False, index=True), Column("cudnn_version", Integer, nullable=False),
          Column("key", Text, nullable=False), Column("created_at", Float, nullable=False),
          Column("body", Text, nullable=False))
    engine = create_engine(url)
    md.create_all(engine)
    table = BenchmarkTable.from_dict(synthetic_table())
    plan = make_plan(table, "wr", workspace_limit="64MiB")
    key = {"old": "key"}
    with engine.begin() as c:
        c.execute(text("INSERT INTO benchmark_tables VALUES (:id, :d, :v, NULL, :k, :t, :b)"),
                  {"id": table.content_id(), "d": table.device, "v": table.cudnn_version, "k": len(table.kernels),
                   "t": time.time(), "b": table.to_json()})
        c.execute(text("INSERT INTO plans VALUES (:id, :key, :tid, :d, :v, 'wr', 'powerOfTwo', :wl, NULL, :tt, :t, :b)"),
                  {"id": key_id(key), "key": json.dumps(key), "tid": table.content_id(), "d": table.device,
                   "v": table.cudnn_version, "wl": 64 << 20, "tt": plan.total_time_ms, "t": time.time(),
                   "b": plan.to_json()})
    engine.dispose()
    return table.content_id(), key_id(key)


def test_a_v1_store_opens_keeps_its_rows_and_is_upgraded_to_head(store_url):
    table_id, plan_id = create_v1_store(store_url)
    store = Store(store_url)
    with store.engine.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    assert store.get_table(table_id).content_id() == table_id
    assert isinstance(store.get_plan(plan_id), Plan)
    assert [t["id"] for t in store.list_tables()] == [table_id]
    assert "jobs" in inspect(store.engine).get_table_names()
    # what the new revision is for: sizes beyond 32 bits, and jobs
    big = make_plan(store.get_table(table_id), "wr", workspace_limit=6 << 30)
    pid = store.put_plan({"big": 1}, big)
    assert store.get_plan(pid).workspace_limit == 6 << 30
    store.put_job("ab12", {"problems": []}, 3)
    assert store.get_job("ab12")["total"] == 3
    # revision 0003: batch-policy names longer than 16 characters (PostgreSQL enforces the column's length)
    for policy in ("powerOfTwoAndEvenSplits", "powerOfTwoAndMidpoints"):
        long = make_plan(store.get_table(table_id), "wr", workspace_limit="64MiB", batch_policy=policy)
        assert store.get_plan(store.put_plan({"policy": policy}, long)).batch_policy == policy


def test_opening_an_up_to_date_store_again_changes_nothing(store_url):
    Store(store_url).put_table(BenchmarkTable.from_dict(synthetic_table()))
    again = Store(store_url)
    assert len(again.list_tables()) == 1


def test_the_head_constant_is_the_newest_revision():
    from pathlib import Path

    import ucudnn.server.migrations as m
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(m.__file__).parent))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD


def test_a_store_newer_than_this_code_is_not_touched(tmp_path):
    url = f"sqlite:///{tmp_path / 'future.sqlite'}"
    Store(url)
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(Exception):
        Store(url)  # Alembic does not know revision 9999: refuse rather than guess


def test_a_migration_that_loses_a_race_with_another_process_retries(tmp_path, monkeypatch):
    """Two processes opening a new SQLite store: one's DDL can land between the other's inspection and its own
    ("table ... already exists").  The loser's transaction rolls back and it tries again instead of failing."""
    import ucudnn.server.migrations as mig

    real = mig._upgrade_locked
    calls = []

    def loses_first(engine):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("table benchmark_tables already exists")   # the store is still empty here
        real(engine)

    monkeypatch.setattr(mig, "_upgrade_locked", loses_first)
    store = Store(tmp_path / "s.sqlite")
    assert len(calls) == 2
    with store.engine.connect() as conn:
        assert mig.current_revision(conn) == HEAD


def test_a_migration_that_keeps_failing_raises(tmp_path, monkeypatch):
    import ucudnn.server.migrations as mig

    monkeypatch.setattr(mig, "_upgrade_locked", lambda engine: (_ for _ in ()).throw(RuntimeError("disk full")))
    monkeypatch.setattr(mig.time, "sleep", lambda s: None)
    with pytest.raises(RuntimeError, match="disk full"):
        Store(tmp_path / "s.sqlite")
