"""Plan bundles: export, import and list; portable single files that reading never changes."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ucudnn.catalog import bundle
from ucudnn.catalog.store import Store
from ucudnn.cli import main
from ucudnn.cluster.engines import ReplaySource
from ucudnn.cluster.engines.local import LocalEngine
from ucudnn.cluster.precompute import JobSpec, run_job
from ucudnn.planning.table import BenchmarkTable

ALEXNET = "builtin:alexnet-b256-float32-NCHW-h100"
A100 = "NVIDIA A100-SXM4-80GB"


def precompute(store: Store, tables: list, limits=(8 << 20, 64 << 20), totals=(960 << 20,)) -> dict:
    spec = JobSpec(tables=[str(t) for t in tables], workspace_limits=list(limits), total_workspaces=list(totals))
    engine = LocalEngine()
    try:
        return run_job(spec, engine, store, source=ReplaySource(spec.tables))
    finally:
        engine.close()


@pytest.fixture
def two_devices(tmp_path) -> Store:
    """A store with AlexNet measured on an H100 (recorded) and, relabelled, on an A100 with another cuDNN."""
    other = BenchmarkTable.load(ALEXNET)
    other.device, other.cudnn_version = A100, 90100
    other.save(tmp_path / "a100.json")
    store = Store(tmp_path / "cluster.sqlite")
    precompute(store, [ALEXNET, tmp_path / "a100.json"])
    return store


def rows(store: Store) -> dict[str, set[str]]:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(store.engine) as s:
        return {cls.__tablename__: set(s.execute(select(cls.id)).scalars()) for cls in bundle.ROW_TYPES}


def test_a_bundle_round_trips_every_row(tmp_path, two_devices):
    counts = bundle.export(two_devices, tmp_path / "all.bundle")
    assert counts == {"benchmark_tables": 2, "kernel_benches": 30, "plans": 6}
    fresh = Store(tmp_path / "fresh.sqlite")
    assert bundle.import_bundle(tmp_path / "all.bundle", fresh) == counts
    assert rows(fresh) == rows(two_devices)
    [tid] = [t["id"] for t in fresh.list_tables() if t["device"] == A100]
    assert fresh.get_table(tid).to_dict() == two_devices.get_table(tid).to_dict()
    assert bundle.import_bundle(tmp_path / "all.bundle", fresh) == dict.fromkeys(counts, 0)  # idempotent


def test_export_keeps_only_the_devices_asked_for(tmp_path, two_devices):
    bundle.export(two_devices, tmp_path / "h100.bundle", devices=["H100"])
    assert bundle.BundleReader(tmp_path / "h100.bundle").targets() == {("NVIDIA H100 80GB HBM3", 91900)}
    bundle.export(two_devices, tmp_path / "old.bundle", cudnn_versions=[90100])
    assert bundle.BundleReader(tmp_path / "old.bundle").targets() == {(A100, 90100)}


def test_list_has_one_entry_per_plan_with_its_table_policy_sizes_and_target(tmp_path, two_devices):
    bundle.export(two_devices, tmp_path / "b.bundle")
    plans = bundle.list_plans(tmp_path / "b.bundle")
    assert len(plans) == 6
    table_ids = {t["id"] for t in two_devices.list_tables()}
    for p in plans:
        assert p["table"] in table_ids and p["kernels"] == 15 and p["batch_policy"] == "powerOfTwo"
        assert (p["policy"], p["workspace_limit"], p["total_workspace"]) in {
            ("wr", 8 << 20, None), ("wr", 64 << 20, None), ("wd", None, 960 << 20)}
        assert p["total_time_ms"] > 0 and p["cudnn_version"] in (91900, 90100)


def test_the_bundle_commands(tmp_path, two_devices, capsys, monkeypatch):
    monkeypatch.setenv("UCUDNN_DATABASE", str(two_devices.url.removeprefix("sqlite:///")))
    assert main(["bundle", "export", str(tmp_path / "b.bundle"), "--device", "A100"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["added"]["plans"] == 3 and [t["device"] for t in exported["targets"]] == [A100]
    assert main(["bundle", "import", str(tmp_path / "b.bundle"), "--store", str(tmp_path / "x.sqlite")]) == 0
    assert json.loads(capsys.readouterr().out)["added"]["kernel_benches"] == 15
    assert main(["bundle", "list", str(tmp_path / "b.bundle")]) == 0
    assert "A100" in capsys.readouterr().out


def test_reading_a_bundle_changes_nothing_and_leaves_no_side_files(tmp_path, two_devices):
    path = tmp_path / "b.bundle"
    bundle.export(two_devices, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    reader = bundle.BundleReader(path)
    reader.list_plans()
    reader.close()
    bundle.list_plans(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("b.bundle")) == ["b.bundle"]


@pytest.mark.parametrize("content", [None, b"not a database at all" * 100])
def test_what_is_not_a_bundle_is_refused_naming_the_bundle(tmp_path, content):
    path = tmp_path / "x.bundle"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(bundle.BundleError) as e:
        bundle.BundleReader(path)
    assert e.value.field == "bundle" and str(path) in str(e.value)


def test_a_bundle_of_another_schema_revision_is_refused_with_the_way_out(tmp_path, two_devices):
    import sqlite3

    path = tmp_path / "b.bundle"
    bundle.export(two_devices, path)
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = '0099'")
    con.commit()
    con.close()
    with pytest.raises(bundle.BundleError, match="0099.*ucudnn bundle import"):
        bundle.BundleReader(path)


def test_installed_bundles_come_from_the_system_directory_then_the_bundle_path(tmp_path, monkeypatch):
    system, user = tmp_path / "system", tmp_path / "user"
    system.mkdir()
    user.mkdir()
    for p in (system / "b.bundle", system / "a.bundle", user / "c.sqlite", tmp_path / "d.bundle"):
        p.write_bytes(b"")
    (system / "notes.txt").write_text("not a bundle")
    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", f"{user}:{tmp_path / 'd.bundle'}:{tmp_path / 'missing'}")
    assert bundle.installed_bundles(system) == [system / "a.bundle", system / "b.bundle", user / "c.sqlite",
                                                tmp_path / "d.bundle"]
    assert bundle.installed_bundles(tmp_path / "nowhere") == [user / "c.sqlite", tmp_path / "d.bundle"]


def test_the_default_system_directory_is_under_the_installation_prefix():
    import sys

    assert bundle.system_bundle_dir() == Path(sys.prefix) / "share" / "ucudnn" / "bundles"
