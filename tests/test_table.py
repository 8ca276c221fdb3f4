"""The benchmark table format: valid tables round-trip, malformed ones are refused naming the field."""
from __future__ import annotations

import copy
import json

import pytest

from ucudnn.errors import TableError
from ucudnn.planning.table import BenchmarkTable, builtin_tables
from ucudnn.schemas import load_schema

GOOD = {"format": "ucudnn-benchmark-table/1", "device": "NVIDIA H100 80GB HBM3", "cudnn_version": 91900,
        "kernels": [{"name": "conv2/forward", "op": "forward",
                     "problem": {"n": 256, "c": 96, "h": 27, "w": 27, "k": 256, "r": 5, "s": 5, "pad": [2, 2],
                                 "stride": [1, 1], "dilation": [1, 1], "groups": 1, "dtype": "float32",
                                 "layout": "NCHW"},
                     "measurements": [{"micro_batch": 1, "algo": 0, "math_type": "FMA", "time_ms": 0.145,
                                       "workspace_bytes": 0, "my_note": "extra fields are fine"}]}]}


def test_the_issue_example_loads_and_round_trips():
    t = BenchmarkTable.from_dict(GOOD)
    again = BenchmarkTable.from_dict(json.loads(t.to_json()))
    assert again.to_dict() == t.to_dict()
    assert t.kernels[0].measurements[0].extra == {"my_note": "extra fields are fine"}
    assert t.content_id() == again.content_id()


@pytest.mark.parametrize("path,value,field", [
    (("format",), "other/1", "format"),
    (("kernels", 0, "problem", "n"), 0, "kernels[0].problem.n"),
    (("kernels", 0, "problem", "dtype"), "float8", "kernels[0].problem.dtype"),
    (("kernels", 0, "op"), "sideways", "kernels[0].op"),
    (("kernels", 0, "measurements", 0, "time_ms"), -1.0, "kernels[0].measurements[0].time_ms"),
    (("kernels", 0, "measurements", 0, "time_ms"), float("nan"), "kernels[0].measurements[0].time_ms"),
    (("kernels", 0, "measurements", 0, "workspace_bytes"), -5, "kernels[0].measurements[0].workspace_bytes"),
    (("kernels", 0, "measurements", 0, "micro_batch"), 257, "kernels[0].measurements[0].micro_batch"),
    (("cudnn_version",), "nine", "cudnn_version"),
    (("kernels", 0, "problem", "r"), 40, "kernels[0].problem"),
])
def test_malformed_tables_are_refused_naming_the_field(path, value, field):
    doc = copy.deepcopy(GOOD)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(TableError) as e:
        BenchmarkTable.from_dict(doc)
    assert e.value.field == field, str(e.value)


def test_not_json_and_missing_files_are_table_errors(tmp_path):
    with pytest.raises(TableError, match="not valid JSON"):
        BenchmarkTable.loads("{nope")
    with pytest.raises(TableError, match="cannot read"):
        BenchmarkTable.load(tmp_path / "missing.json")
    with pytest.raises(TableError, match="no shipped table"):
        BenchmarkTable.load("builtin:no-such-table")


def test_gzip_tables_round_trip(tmp_path):
    t = BenchmarkTable.from_dict(GOOD)
    t.save(tmp_path / "t.json.gz")
    assert BenchmarkTable.load(tmp_path / "t.json.gz").to_dict() == t.to_dict()


def test_shipped_tables_are_real_h100_recordings_that_validate():
    names = builtin_tables()
    assert "alexnet-b256-float32-NCHW-h100" in names
    for name in names:
        t = BenchmarkTable.load(f"builtin:{name}")
        assert t.device.startswith("NVIDIA H100") and t.cudnn_version >= 90000
        assert all(k.measurements for k in t.kernels)


def test_merging_tables_of_different_devices_is_refused():
    a = BenchmarkTable.from_dict(GOOD)
    b = BenchmarkTable.from_dict(dict(copy.deepcopy(GOOD), device="NVIDIA A100"))
    with pytest.raises(TableError, match="cannot merge"):
        BenchmarkTable.merge([a, b])


def test_the_schema_file_is_itself_a_valid_json_schema():
    import jsonschema

    for name in ("ucudnn-benchmark-table/1", "ucudnn-plan/1", "ucudnn-network/1"):
        schema = load_schema(name)
        jsonschema.validators.validator_for(schema).check_schema(schema)


def test_nan_and_infinity_anywhere_in_the_text_are_refused():
    text = json.dumps(GOOD).replace('"my_note": "extra fields are fine"', '"my_note": NaN')
    with pytest.raises(TableError, match="NaN"):
        BenchmarkTable.loads(text)
