"""Benchmark tables without a ``numerics`` field (issue 16): every command that reads tables accepts them.

``ucudnn-benchmark-table/1`` began without the field and other tools still write such tables.  One rule
(``ucudnn.planning.table.effective_numerics``) says what they are taken to have: the dtype's default when
every recorded math type is allowed under it, else the narrowest numerics that allows them all.  These tests
run the issue's exact command on such tables (local and Ray engines), compare the bundle's plans with
``ucudnn plan --from-table``, look the bundle up as the library does, and send the tables to the plan service.
"""
from __future__ import annotations

import copy
import json
import logging
from importlib import resources
from pathlib import Path

import pytest
from server_kit import http, make_server, server, store_url  # noqa: F401 (fixtures)

from ucudnn.catalog import bundle, lookup
from ucudnn.catalog.store import Store
from ucudnn.cli import main
from ucudnn.cluster.engines.base import Target
from ucudnn.cluster.precompute import plan_key
from ucudnn.errors import TableError
from ucudnn.numerics import inferred
from ucudnn.planning.plan import Plan
from ucudnn.planning.planner import plan as local_plan
from ucudnn.planning.table import BenchmarkTable, effective_numerics

H100 = Target("NVIDIA H100 80GB HBM3", 91900)
LIMITS = {"8MiB": 8 << 20, "64MiB": 64 << 20, "512MiB": 512 << 20}
TOTALS = {"120MiB": 120 << 20, "960MiB": 960 << 20}
STRICT_NOTE = "no numerics field; taken as strict (float32 default)"


def shipped(name: str) -> dict:
    return json.loads(resources.files("ucudnn.data.tables").joinpath(name + ".json").read_text())


def without_numerics(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    del doc["numerics"]
    return doc


def tf32_like(doc: dict) -> dict:
    """The AlexNet FP32 recording with two algorithms relabelled TENSOR_OP, as a TF32 measurement records them."""
    doc = without_numerics(doc)
    for k in doc["kernels"]:
        for m in k["measurements"]:
            if m["algo"] in (1, 6):
                m["math_type"] = "TENSOR_OP"
    return doc


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    """A.json (AlexNet), B.json (ResNet-50): real H100 FP32 FMA recordings; C.json: AlexNet with TENSOR_OP rows."""
    d = tmp_path_factory.mktemp("tables")
    docs = {"A.json": without_numerics(shipped("alexnet-b256-float32-NCHW-h100")),
            "B.json": without_numerics(shipped("resnet50-b128-float32-NCHW-h100")),
            "C.json": tf32_like(shipped("alexnet-b256-float32-NCHW-h100")),
            "H.json": without_numerics(shipped("alexnet-b256-float16-NHWC-h100"))}
    for name, doc in docs.items():
        assert "numerics" not in doc
        (d / name).write_text(json.dumps(doc))
    return {name: d / name for name in docs}


def issue_command(a: Path, b: Path, out: Path, engine: str) -> list[str]:
    return ["precompute", "--from-table", str(a), "--from-table", str(b), "--workspace-limits", "8MiB,64MiB,512MiB",
            "--total-workspaces", "120MiB,960MiB", "--batch-policy", "powerOfTwo", "--engine", engine,
            "--out", str(out)]


def plan_from_table(capsys, table: Path, *flags: str) -> dict:
    assert main(["plan", "--from-table", str(table), "--batch-policy", "powerOfTwo", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def same_plan(stored: Plan, cli: dict) -> None:
    doc = stored.to_dict()
    assert doc["kernels"] == cli["kernels"]
    assert doc["total_time_ms"] == pytest.approx(cli["total_time_ms"])
    assert doc["workspace_bytes"] == cli["workspace_bytes"]
    assert stored.numerics == cli["numerics"]


def check_bundle(capsys, out: Path, tables: dict[str, Path], names: list[str], summary: dict) -> None:
    """Every unit measured, every plan stored, and the WR plans are ``ucudnn plan --from-table``'s."""
    assert summary["ok"] and summary["units"]["failed"] == 0 and summary["failed_units"] == []
    assert summary["units"]["measured"] == summary["units"]["total"] > 0
    assert summary["plans"]["stored"] == len(names) * (len(LIMITS) + len(TOTALS)) and summary["plans"]["failed"] == []
    reader = bundle.BundleReader(out)
    try:
        for name, rep in zip(names, summary["tables"]):
            assert rep["status"] == "stored" and rep["name"] == str(tables[name])
            for text, size in LIMITS.items():
                stored = reader.find_plan(plan_key(rep["id"], "wr", "powerOfTwo", size))
                assert stored is not None, (name, text)
                same_plan(stored[1], plan_from_table(capsys, tables[name], "--workspace-limit", text))
            for text, size in TOTALS.items():
                stored = reader.find_plan(plan_key(rep["id"], "wd", "powerOfTwo", size))
                assert stored is not None and stored[1].workspace_bytes <= size
                cli = plan_from_table(capsys, tables[name], "--policy", "wd", "--total-workspace", text)
                assert stored[1].total_time_ms == pytest.approx(cli["total_time_ms"], rel=1e-6)
    finally:
        reader.close()


def stored_bench_key(path: Path, kb) -> dict:
    """The key under which the bundle holds ``kb``'s measurements (what the library's lookup asks for)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from ucudnn.catalog.store import KernelBenchRow

    reader = bundle.BundleReader(path)
    try:
        with Session(reader.engine) as s:
            keys = [json.loads(k) for k in s.execute(select(KernelBenchRow.key)).scalars()]
    finally:
        reader.close()
    [key] = [k for k in keys if k["problem"] == kb.problem.to_dict() and k["op"] == kb.op]
    return key


# -- the rule ------------------------------------------------------------------------------------------------------
def test_the_rule_is_the_dtype_default_unless_the_math_types_need_a_wider_numerics():
    assert inferred("float32", ["FMA"]) == inferred("float32", []) == "strict"
    assert inferred("float32", ["FMA", "TENSOR_OP"]) == inferred("float32", ["DEFAULT"]) == "tf32"
    assert inferred("float32", ["FMA", "TENSOR_OP_ALLOW_CONVERSION"]) == "default"
    for dtype in ("float16", "bfloat16"):  # their default allows every math type (FMA too: stricter math)
        assert inferred(dtype, ["DEFAULT", "TENSOR_OP", "FMA", "TENSOR_OP_ALLOW_CONVERSION"]) == "default"
    assert inferred("float32", ["FMA", "TF32_SOMETHING"]) is None


def test_tables_without_the_field_are_taken_as_the_rule_says_and_say_so(tables):
    a, c, h = (BenchmarkTable.load(tables[n]) for n in ("A.json", "C.json", "H.json"))
    assert a.numerics is None and effective_numerics(a) == ("strict", STRICT_NOTE)
    assert effective_numerics(c).numerics == "tf32" and "TENSOR_OP" in effective_numerics(c).note
    assert effective_numerics(h) == ("default", "no numerics field; taken as default (float16 default)")
    spelled = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")
    assert effective_numerics(spelled) == ("strict", None)
    # one table, one id: with or without the field spelled out
    assert a.content_id() == a.resolved().content_id() == spelled.content_id()
    assert a.resolved().to_dict() == spelled.to_dict()
    odd = BenchmarkTable.from_dict(dict(without_numerics(shipped("alexnet-b256-float32-NCHW-h100")), kernels=[
        dict(k, measurements=[dict(m, math_type="WEIRD") for m in k["measurements"]]) for k in a.to_dict()["kernels"]]))
    assert effective_numerics(odd).numerics == "default" and "WEIRD" in effective_numerics(odd).note


def test_merging_compares_the_numerics_tables_are_taken_to_have(tables):
    a, c = BenchmarkTable.load(tables["A.json"]), BenchmarkTable.load(tables["C.json"])
    spelled = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")
    assert BenchmarkTable.merge([a]).numerics == "strict"
    assert BenchmarkTable.merge([a, spelled]).numerics == "strict"
    with pytest.raises(TableError, match="tf32"):
        BenchmarkTable.merge([c, spelled])  # C is tf32, the spelled-out table strict


def test_ucudnn_plan_records_the_numerics_it_took(capsys, tables):
    assert plan_from_table(capsys, tables["A.json"], "--workspace-limit", "64MiB")["numerics"] == "strict"
    assert plan_from_table(capsys, tables["C.json"], "--workspace-limit", "64MiB")["numerics"] == "tf32"


# -- precompute, bundles, lookup --------------------------------------------------------------------------------------
def test_the_issue_command_on_the_local_engine_plans_every_unit_and_states_the_numerics(tmp_path, capsys, tables):
    out = tmp_path / "plans.bundle"
    rc = main(issue_command(tables["A.json"], tables["B.json"], out, "local"))
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert rc == 0, summary["failed_units"][:1]
    assert summary["notes"] == [f"{tables['A.json']}: {STRICT_NOTE}", f"{tables['B.json']}: {STRICT_NOTE}"]
    assert [(t["numerics"], t["numerics_note"]) for t in summary["tables"]] == [("strict", STRICT_NOTE)] * 2
    assert f"{tables['A.json']}: {STRICT_NOTE}" in captured.err
    check_bundle(capsys, out, tables, ["A.json", "B.json"], summary)

    # the bundle's manifest (bundle list) records the numerics; its tables spell the field out
    assert main(["bundle", "list", str(out), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 10 and {p["numerics"] for p in listed} == {"strict"}
    assert main(["bundle", "list", str(out)]) == 0
    assert "strict" in capsys.readouterr().out
    reader = bundle.BundleReader(out)
    try:
        assert {t["numerics"] for t in reader.list_tables()} == {"strict"}
        # the library's lookup finds the bundle's measurements under its own key (numerics strict) ...
        kb = BenchmarkTable.load(tables["A.json"]).kernel("conv2/forward")
        bench = stored_bench_key(out, kb)
        assert (bench["device"], bench["cudnn_version"], bench["numerics"]) == (H100.device, 91900, "strict")

        def never():
            raise AssertionError("benchmarked although the bundle holds the kernel")

        found = lookup.kernel_plan({**bench, "workspace_limit": 64 << 20}, bench, benchmark=never, bundles=[out])
        assert found.layer == f"bundle:{out}"
        assert found.plan.configs == lookup.wr_plan(kb, {**bench, "workspace_limit": 64 << 20}).configs
        # ... and never serves them to a caller of other numerics
        tf32 = {**bench, "numerics": "tf32"}
        asked = []
        lookup.kernel_plan({**tf32, "workspace_limit": 64 << 20}, tf32, bundles=[out],
                           benchmark=lambda: asked.append(1) or kb)
        assert asked == [1]
    finally:
        reader.close()


def test_a_table_whose_math_types_are_not_the_dtype_default_is_planned_under_the_wider_numerics(tmp_path, capsys,
                                                                                                   tables):
    out = tmp_path / "plans.bundle"
    rc = main(issue_command(tables["A.json"], tables["C.json"], out, "local"))
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [t["numerics"] for t in summary["tables"]] == ["strict", "tf32"]
    assert "taken as tf32" in summary["notes"][1] and summary["notes"][1].startswith(str(tables["C.json"]))
    # A and C share every problem: different numerics, so distinct units
    assert summary["units"]["total"] == 2 * len(BenchmarkTable.load(tables["A.json"]).kernels)
    check_bundle(capsys, out, tables, ["A.json", "C.json"], summary)
    listed = json.loads((main(["bundle", "list", str(out), "--json"]), capsys.readouterr().out)[1])
    assert {(p["table"], p["numerics"]) for p in listed} == {(summary["tables"][0]["id"], "strict"),
                                                            (summary["tables"][1]["id"], "tf32")}


def test_exporting_a_store_with_a_table_without_numerics_spells_them_out_in_the_bundle(tmp_path, tables):
    store = Store(tmp_path / "old.sqlite")
    raw = BenchmarkTable.load(tables["C.json"])
    tid = store.put_table(raw)  # as an older service stored an uploaded table
    assert store.list_tables()[0]["numerics"] is None
    store.put_plan({"service": 1, "table_id": tid, "policy": "wr", "batch_policy": "powerOfTwo",
                    "workspace_limit": 64 << 20, "total_workspace": None},
                   local_plan(raw, "wr", workspace_limit=64 << 20), tid)
    out = tmp_path / "b.bundle"
    bundle.export(store, out)
    reader = bundle.BundleReader(out)
    try:
        assert [(t["id"], t["numerics"]) for t in reader.list_tables()] == [(tid, "tf32")]
        assert reader.get_table(tid).numerics == "tf32"
    finally:
        reader.close()
    assert [p["numerics"] for p in bundle.list_plans(out)] == ["tf32"]


@pytest.mark.slow
def test_the_issue_command_on_ray(tmp_path, capsys, tables):
    ray = pytest.importorskip("ray")
    mine = not ray.is_initialized()  # as the command would without --address: a local Ray, here a small one
    if mine:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        out = tmp_path / "plans.bundle"
        rc = main(issue_command(tables["A.json"], tables["B.json"], out, "ray"))
        summary = json.loads(capsys.readouterr().out)
    finally:
        if mine:
            ray.shutdown()
    assert rc == 0 and summary["engine"] == "ray", summary["failed_units"][:1]
    assert summary["notes"] == [f"{tables['A.json']}: {STRICT_NOTE}", f"{tables['B.json']}: {STRICT_NOTE}"]
    check_bundle(capsys, out, tables, ["A.json", "B.json"], summary)


# -- the plan service -----------------------------------------------------------------------------------------------
def test_the_service_stores_and_plans_a_table_without_numerics(http, tables):
    doc = json.loads(tables["A.json"].read_text())
    r = http.post("/v1/tables", json=doc)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["numerics"] == "strict" and body["numerics_note"] == STRICT_NOTE
    assert body["id"] == BenchmarkTable.from_dict(doc).content_id()
    assert http.get(f"/v1/tables/{body['id']}").json()["numerics"] == "strict"
    assert [t["numerics"] for t in http.get("/v1/tables").json()] == ["strict"]
    plan = http.post("/v1/plans", json={"table_id": body["id"], "policy": "wr", "workspace_limit": "64MiB",
                                        "batch_policy": "powerOfTwo"})
    assert plan.status_code == 200, plan.text
    expected = local_plan(BenchmarkTable.from_dict(doc), "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert plan.json()["numerics"] == "strict"
    assert plan.json()["kernels"] == expected.to_dict()["kernels"]

    tf32 = json.loads(tables["C.json"].read_text())
    inline = http.post("/v1/plans", json={"table": tf32, "policy": "wd", "total_workspace": "120MiB"})
    assert inline.status_code == 200, inline.text
    assert inline.json()["numerics"] == "tf32"
    again = http.post("/v1/tables", json=tf32).json()
    assert again["id"] == inline.json()["table_id"] and again["numerics"] == "tf32"
    assert "TENSOR_OP" in again["numerics_note"]
    spelled = http.post("/v1/tables", json=shipped("alexnet-b256-float32-NCHW-h100")).json()
    assert spelled == {"id": body["id"], "numerics": "strict", "numerics_note": None}  # the same table


def test_the_service_plans_a_table_an_older_version_stored_without_numerics(tmp_path, make_server, tables):
    url = f"sqlite:///{tmp_path / 'older.sqlite'}"
    tid = Store(url).put_table(BenchmarkTable.load(tables["C.json"]))  # stored as it came, no numerics
    srv = make_server(url)
    import httpx

    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v1/plans", json={"table_id": tid, "policy": "wr", "workspace_limit": "64MiB"})
    assert r.status_code == 200, r.text
    assert r.json()["numerics"] == "tf32" and r.json()["table_id"] == tid
