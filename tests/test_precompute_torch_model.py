"""``ucudnn precompute --torch-model MODULE:FACTORY --input-shape C,H,W`` (issue 15), on CPU.

Measuring needs a GPU, so these tests cover what the driver does before any GPU work: parsing the
flags, tracing the model into a network (its layers against a hand-computed list), the units it would
run (against the same network given as ``--network``), a whole job replayed from the recorded AlexNet
table, and the error messages.  The models are this directory's ``_torch_models`` (torchvision is
optional: its case is skipped without it).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from _torch_models import SMALL_CNN_AT_3_32_32  # noqa: E402

from ucudnn.cli import build_parser, main  # noqa: E402
from ucudnn.cluster.engines.base import Target  # noqa: E402
from ucudnn.cluster.precompute import JobSpec, NetworkRequest, expand, merge_flags  # noqa: E402
from ucudnn.errors import InputError  # noqa: E402
from ucudnn.planning.network import load_network  # noqa: E402

H100 = Target("NVIDIA H100 80GB HBM3", 91900)
ALEXNET_TABLE = "builtin:alexnet-b256-float32-NCHW-h100"


@pytest.fixture(autouse=True)
def _legacy_sources(monkeypatch):
    """The recorded tables these jobs replay were measured with the legacy source alone."""
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")



def spec_of(*argv: str) -> JobSpec:
    """The job ``ucudnn precompute ARGV`` would run (flags parsed and merged, models traced)."""
    return merge_flags(None, build_parser().parse_args(["precompute", *argv]))


def test_a_torch_model_is_traced_into_a_network_with_the_layers_it_runs():
    spec = spec_of("--torch-model", "_torch_models:small_cnn@64,128", "--input-shape", "3,32,32",
                   "--workspace-limits", "64MiB")
    [req] = spec.networks
    assert req.network == "_torch_models:small_cnn" and req.batch_sizes == [64, 128]
    assert req.input_shape == (3, 32, 32)
    assert req.load().layers == SMALL_CNN_AT_3_32_32
    assert spec.to_dict()["networks"] == [{"torch_model": "_torch_models:small_cnn", "input_shape": [3, 32, 32],
                                           "batch_sizes": [64, 128]}]
    assert spec.workspace_limits == [64 << 20]


def test_a_job_file_names_a_torch_model_as_the_flags_do_and_a_job_reads_back_what_it_writes():
    """``{torch_model, input_shape, batch_sizes}`` in a job file is ``--torch-model M:F@B --input-shape C,H,W``;
    the job a summary records (``to_dict``) is a job file that runs the same units."""
    flags = spec_of("--torch-model", "_torch_models:small_cnn@64", "--input-shape", "3,32,32", "--network",
                    "alexnet@256", "--workspace-limits", "64MiB")
    doc = {"networks": [{"name": "alexnet", "batch_sizes": [256]},
                        {"torch_model": "_torch_models:small_cnn", "input_shape": [3, 32, 32], "batch_sizes": [64]}],
           "workspace_limits": ["64MiB"]}
    filed = JobSpec.from_dict(doc)
    again = JobSpec.from_dict(flags.to_dict())
    for spec in (filed, again):
        assert [(n.network, n.batch_sizes, n.input_shape) for n in spec.networks] == \
            [("alexnet", [256], None), ("_torch_models:small_cnn", [64], (3, 32, 32))]
        assert spec.networks[1].load().layers == SMALL_CNN_AT_3_32_32
        assert [[u.id for _, u in r.kernels] for r in expand(spec, [H100])] == \
            [[u.id for _, u in r.kernels] for r in expand(flags, [H100])]


@pytest.mark.parametrize("net,field", [
    ({"torch_model": "_torch_models:small_cnn"}, "networks[0]"),
    ({"torch_model": "no_colon", "input_shape": [3, 32, 32]}, "job.networks[0].torch_model"),
    ({"torch_model": "_torch_models:small_cnn", "input_shape": [3, 32]}, "networks[0].input_shape"),
])
def test_a_bad_torch_model_in_a_job_file_names_its_field(net, field):
    with pytest.raises(InputError) as e:
        JobSpec.from_dict({"networks": [net]})
    assert e.value.field.endswith(field)


def test_the_issues_form_without_a_batch_precomputes_the_stated_default_batch(capsys):
    """``--torch-model M:F --input-shape C,H,W`` as the issue writes it: batch 128, said on stderr."""
    from ucudnn.cluster.precompute import TORCH_MODEL_BATCH

    spec = spec_of("--torch-model", "_torch_models:small_cnn", "--input-shape", "3,32,32")
    assert "no batch size given" in capsys.readouterr().err
    [req] = expand(spec, [H100])
    assert req.name == f"_torch_models:small_cnn-b{TORCH_MODEL_BATCH}-float32-NCHW-strict"
    assert {u.problem.n for _, u in req.kernels} == {TORCH_MODEL_BATCH}


def test_its_units_are_those_of_the_same_network_named_with_network(tmp_path):
    """Same crossing (batch x dtype x layout x numerics), same units as a ``--network`` of the same layers."""
    flags = ["--batch", "32", "--dtype", "float32,float16", "--layout", "NCHW,NHWC", "--workspace-limits", "8MiB"]
    traced = spec_of("--torch-model", "_torch_models:small_cnn", "--input-shape", "3,32,32", *flags)
    net = traced.networks[0].load()
    (tmp_path / "small.json").write_text(json.dumps(net.to_dict()))
    named = spec_of("--network", str(tmp_path / "small.json"), *flags)

    a, b = expand(traced, [H100]), expand(named, [H100])
    assert len(a) == len(b) == 1 * 2 * 2  # one batch, two dtypes, two layouts, each dtype's default numerics
    assert [r.numerics for r in a] == ["strict", "strict", "default", "default"]
    assert [r.name for r in a][0] == "_torch_models:small_cnn-b32-float32-NCHW-strict"
    for ra, rb in zip(a, b):
        assert [(name, u.id) for name, u in ra.kernels] == [(name, u.id) for name, u in rb.kernels]
        assert len(ra.kernels) == 3 * len(SMALL_CNN_AT_3_32_32)
        assert len({u.id for _, u in ra.kernels}) == 3 * (len(SMALL_CNN_AT_3_32_32) - 1)  # dil#2 is dil again
        assert ra.extra["network"] == "_torch_models:small_cnn"
    assert {u.problem.n for r in a for _, u in r.kernels} == {32}


def test_torch_models_and_named_networks_share_units():
    spec = spec_of("--network", "alexnet@256", "--torch-model", "_torch_models:alexnet_features@256",
                   "--input-shape", "3,227,227", "--workspace-limits", "64MiB")
    assert [n.network for n in spec.networks] == ["alexnet", "_torch_models:alexnet_features"]
    traced, named = spec.networks[1].load(), load_network("alexnet")
    assert traced.layers == named.layers  # the same five convolutions, by the same names
    shipped, model = expand(spec, [H100])
    assert [u.id for _, u in shipped.kernels] == [u.id for _, u in model.kernels]


def test_a_torch_model_precomputes_end_to_end_from_a_recorded_table(tmp_path, capsys):
    """The whole job on CPU: units replayed from the H100 AlexNet recording, planned and bundled."""
    out = tmp_path / "plans.bundle"
    rc = main(["precompute", "--torch-model", "_torch_models:alexnet_features@256", "--input-shape", "3,227,227",
               "--from-table", ALEXNET_TABLE, "--workspace-limits", "8MiB,64MiB", "--total-workspaces", "120MiB",
               "--batch-policy", "powerOfTwo", "--engine", "local", "--out", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["ok"], summary["failed_units"][:1]
    assert summary["units"] == {"total": 15, "kernels_requested": 15, "duplicates_removed": 0, "measured": 15,
                                "skipped": 0, "failed": 0, "retried": 0}
    [table] = summary["tables"]
    assert table["name"] == "_torch_models:alexnet_features-b256-float32-NCHW-strict" and table["status"] == "stored"
    assert summary["plans"]["stored"] == 3
    assert summary["spec"]["networks"][0]["input_shape"] == [3, 227, 227]

    # the same plans as the shipped network's, planned from the same recording
    named = tmp_path / "named.bundle"
    assert main(["precompute", "--network", "alexnet@256", "--from-table", ALEXNET_TABLE, "--workspace-limits",
                 "8MiB,64MiB", "--total-workspaces", "120MiB", "--engine", "local", "--out", str(named)]) == 0
    capsys.readouterr()
    assert main(["bundle", "list", str(out), "--json"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["bundle", "list", str(named), "--json"]) == 0
    theirs = json.loads(capsys.readouterr().out)
    key = lambda p: (p["policy"], p["workspace_limit"], p["total_workspace"])  # noqa: E731
    assert sorted((key(p), round(p["total_time_ms"], 6)) for p in mine) == \
        sorted((key(p), round(p["total_time_ms"], 6)) for p in theirs)
    assert {p["table_name"] for p in mine} == {"_torch_models:alexnet_features-b256-float32-NCHW-strict"}

    # the job the summary records, run again as a job file, stores the same plans
    (tmp_path / "job.json").write_text(json.dumps(summary["spec"]))
    again = tmp_path / "again.bundle"
    assert main(["precompute", "--job", str(tmp_path / "job.json"), "--engine", "local", "--out", str(again)]) == 0
    capsys.readouterr()
    assert main(["bundle", "list", str(again), "--json"]) == 0
    rerun = json.loads(capsys.readouterr().out)
    assert sorted((key(p), round(p["total_time_ms"], 6), p["table_name"]) for p in rerun) == \
        sorted((key(p), round(p["total_time_ms"], 6), p["table_name"]) for p in mine)


@pytest.mark.parametrize("argv, field, words", [
    (["--torch-model", "torchvision.models", "--input-shape", "3,224,224", "--batch", "8"], "--torch-model",
     "expected MODULE:FACTORY"),
    (["--torch-model", ":resnet50", "--input-shape", "3,224,224", "--batch", "8"], "--torch-model",
     "expected MODULE:FACTORY"),
    (["--torch-model", "_torch_models:small_cnn@8", "--input-shape", "3,224"], "--input-shape", "expected C,H,W"),
    (["--torch-model", "_torch_models:small_cnn@8", "--input-shape", "3,a,224"], "--input-shape", "expected C,H,W"),
    (["--torch-model", "_torch_models:small_cnn@8", "--input-shape", "0,32,32"], "--input-shape", "expected C,H,W"),
    (["--torch-model", "_torch_models:small_cnn@8"], "--input-shape", "needs --input-shape"),
    (["--network", "alexnet", "--input-shape", "3,224,224"], "--input-shape", "give --torch-model"),
    (["--torch-model", "_torch_models:nope@8", "--input-shape", "3,32,32"], "--torch-model", "cannot load"),
    (["--torch-model", "no_such_module_ucudnn:f@8", "--input-shape", "3,32,32"], "--torch-model",
     "No module named 'no_such_module_ucudnn'"),
    (["--torch-model", "_torch_models:NOT_A_FACTORY@8", "--input-shape", "3,32,32"], "--torch-model",
     "is not callable"),
    (["--torch-model", "_torch_models:needs_arguments@8", "--input-shape", "3,32,32"], "--torch-model",
     "failed: TypeError"),
    (["--torch-model", "_torch_models:small_cnn@8", "--input-shape", "1,32,32"], "--torch-model",
     "at --input-shape 1,32,32 failed: RuntimeError"),
    (["--torch-model", "_torch_models:no_convolutions@8", "--input-shape", "3,32,32"], "--torch-model",
     "no Conv2d layers"),
])
def test_bad_flags_are_refused_naming_the_flag(argv, field, words, capsys):
    with pytest.raises(InputError) as e:
        spec_of(*argv)
    assert e.value.field == field and words in str(e.value)
    assert main(["precompute", *argv]) == 2  # the command: exit 2, the message on stderr
    err = capsys.readouterr().err
    assert f"ucudnn: error: {field}: " in err and words in err


def test_without_torch_the_error_says_how_to_install_it(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    with pytest.raises(InputError, match=r"pip install ucudnn\[torch\]") as e:
        spec_of("--torch-model", "torchvision.models:resnet50@128", "--input-shape", "3,224,224")
    assert e.value.field == "--torch-model"


def test_the_precompute_modules_do_not_import_torch():
    code = ("import sys, ucudnn.cluster.precompute, ucudnn.cli.precompute, ucudnn.cli\n"
            "ucudnn.cli.build_parser()\n"
            "assert 'torch' not in sys.modules, 'torch imported at module import time'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torchvision_resnet50_at_224():
    pytest.importorskip("torchvision")
    spec = spec_of("--torch-model", "torchvision.models:resnet50@128", "--input-shape", "3,224,224")
    net = spec.networks[0].load()
    assert len(net.layers) == 53  # 49 in the bottlenecks' main paths + 4 downsample projections
    assert net.layers[0] == {"name": "conv1", "c": 3, "h": 224, "w": 224, "k": 64, "r": 7, "s": 7, "pad": [3, 3],
                             "stride": [2, 2]}
    shipped = {(u.problem, u.op) for _, u in expand(spec_of("--network", "resnet50@128"), [H100])[0].kernels}
    traced = {(u.problem, u.op) for _, u in expand(spec, [H100])[0].kernels}
    assert traced == shipped


def test_a_network_request_without_a_traced_model_loads_the_named_network():
    assert NetworkRequest("alexnet", [256]).load().layers == load_network("alexnet").layers
