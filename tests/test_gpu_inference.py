"""Inference plans on the GPU (issue 19): measured, planned, run eagerly and replayed, against the float64 reference
and against torchvision's SqueezeNet 1.1 and MobileNet V2."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no GPU", allow_module_level=True)
except Exception:  # noqa: BLE001
    pytest.skip("no GPU", allow_module_level=True)

from test_inference_plan import _small_fire_net, run_plan_numpy  # noqa: E402

from ucudnn.execute.inference import InferenceSession, random_weights, reference, weights_from_torch  # noqa: E402
from ucudnn.inference import infer, plan_inference  # noqa: E402
from ucudnn.planning.inference import LAYOUT_MARGIN, replan  # noqa: E402
from ucudnn.planning.network import load_network  # noqa: E402


def _to_layout(x, layout):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x


@pytest.fixture(scope="module")
def small_plans():
    net = _small_fire_net()
    return {(dt, lo): plan_inference(net, 3, dt, workspace_limit="8MiB", input_layout=lo, sources="legacy",
                                      block_tuning_s=0)
            for dt in ("float32", "float16") for lo in ("NCHW", "NHWC")}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("replay", [False, True])
def test_small_graph_equals_the_float64_reference(small_plans, dtype, layout, replay):
    net = _small_fire_net()
    doc = small_plans[(dtype, layout)]
    w = random_weights(net, 5)
    x = np.random.default_rng(5).standard_normal((3, 3, 13, 13))
    want = reference(net, w, x)
    s = InferenceSession(doc, w, replay=replay)
    for _ in range(3):   # eager, then capture, then replay
        got = s(cp.asarray(_to_layout(x, layout), dtype=dtype))
    got = cp.asnumpy(got).astype(np.float64).reshape(want.shape)
    tol = 2e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 1e-2)
    # the document's own steps compute the same in NumPy (wiring), and fused / unfused plans agree
    np.testing.assert_allclose(run_plan_numpy(doc, w, x), want, rtol=1e-9, atol=1e-12)


def _forced(doc, wide: bool, epilogue: bool):
    """The plan's costs re-planned with every wide block and / or every measured fused epilogue made the
    cheapest way (each way's steps must compute the network, chosen or not)."""
    from ucudnn.planning.inference import InferenceCosts, plan_inference as from_costs
    from ucudnn.planning.network import Network

    c = json.loads(json.dumps(doc["costs"]))
    if wide:
        for name, per in c["blocks"].items():
            if name.startswith("wide:"):
                for lo in per:
                    per[lo] = 1e-6
    if epilogue:
        for per in c["epilogues"].values():
            for e in per.values():
                e["ms"] = 1e-7
    return from_costs(Network.from_dict(doc["network"]), InferenceCosts.from_dict(c), input_layout=doc["input_layout"])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_wide_convs_and_fused_epilogues_compute_the_network(small_plans, dtype, layout):
    net = _small_fire_net()
    doc = small_plans[(dtype, layout)]
    if dtype == "float16":   # cuDNN fuses conv + bias + relu in FP16 on every GPU ucudnn targets (NHWC at least)
        assert doc["costs"]["epilogues"], doc["costs"]["declined"]
    forced = _forced(doc, wide=True, epilogue=True)
    kinds = [s["kind"] for s in forced["steps"]]
    assert kinds.count("wide_conv") == 2 and "concat" not in kinds
    n_epi = sum("epilogue" in s for s in forced["steps"])
    assert n_epi > 0 or not any(doc["costs"]["epilogues"].values())
    w = random_weights(net, 8)
    x = np.random.default_rng(8).standard_normal((3, 3, 13, 13))
    want = reference(net, w, x)
    for replay in (False, True):
        sess = InferenceSession(forced, w, replay=replay)
        assert not sess.notes, sess.notes          # every epilogue rebuilt from its engine tag
        for _ in range(3):
            got = sess(cp.asarray(_to_layout(x, layout), dtype=dtype))
        got = cp.asnumpy(got).astype(np.float64).reshape(want.shape)
        tol = 2e-4 if dtype == "float32" else 2e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 1e-2)


def test_fused_and_unfused_plans_agree(small_plans):
    net = _small_fire_net()
    doc = small_plans[("float32", "NCHW")]
    plain = replan(doc, fuse=False)
    w = random_weights(net, 6)
    x = cp.asarray(np.random.default_rng(6).standard_normal((3, 3, 13, 13)), dtype="float32")
    a = cp.asnumpy(InferenceSession(doc, w)(x)).copy()
    b = cp.asnumpy(InferenceSession(plain, w)(x))
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)


def _torchvision(name):
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(tv.models, name)(num_classes=1000).eval()
    if name == "mobilenet_v2":   # non-trivial BatchNorm statistics, so folding is exercised
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
    return torch, model


@pytest.mark.parametrize("name", ["squeezenet1_1", "mobilenet_v2"])
def test_whole_network_equals_torchvision(name):
    torch, model = _torchvision(name)
    net = load_network(name)
    doc = plan_inference(net, 2, "float32", workspace_limit="8MiB", sources="legacy", block_tuning_s=0)
    w = weights_from_torch(net, model)
    x = torch.randn(2, 3, 224, 224)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        want = torch.softmax(model.double()(x.double()), dim=1).numpy()
    got = cp.asnumpy(infer(doc, cp.asarray(x.numpy()), w)).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
    # the plan is a document: it round-trips through JSON and still runs
    again = json.loads(json.dumps(doc))
    got2 = cp.asnumpy(InferenceSession(again, w)(cp.asarray(x.numpy()))).reshape(want.shape)
    np.testing.assert_allclose(got2, got, rtol=1e-6, atol=1e-9)


def test_cli_plans_squeezenet_for_inference(tmp_path):
    out = tmp_path / "sq.json"
    r = subprocess.run([sys.executable, "-m", "ucudnn", "plan", "--network", "squeezenet1_1", "--inference",
                        "--batch", "1", "--workspace-limit", "8MiB", "--sources", "legacy", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["batch"] == 1 and doc["workspace_limit"] == 8 << 20
    assert "total (predicted)" in r.stdout
    for how, ms in doc["baselines"].items():   # a single layout strictly; the others within the noise margin
        assert ms is None or doc["predicted_ms"] <= ms * (1 + (how not in ("NCHW", "NHWC")) * LAYOUT_MARGIN) + 1e-9


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mode,window,stride,pad", [("max", 3, 2, 0), ("max", 3, 2, 1), ("avg", 2, 2, 0),
                                                    ("avg", 7, 7, 0), ("max", (3, 2), (1, 2), (1, 0))])
def test_nhwc_pooling_equals_nchw_pooling(dtype, mode, window, stride, pad):
    from ucudnn.kernels import pooling

    x = cp.asarray(np.random.default_rng(0).standard_normal((3, 5, 14, 14)), dtype=dtype)   # NCHW, C = 5
    want = pooling.pool2d_forward(x, window, stride, pad, mode, "NCHW")
    got = pooling.pool2d_forward(cp.ascontiguousarray(x.transpose(0, 2, 3, 1)), window, stride, pad, mode, "NHWC")
    cp.testing.assert_allclose(got.transpose(0, 3, 1, 2), want, rtol=1e-3 if dtype == "float16" else 1e-6)


def test_torch_inference_module_equals_the_model():
    torch, model = _torchvision("squeezenet1_1")
    import ucudnn.torch

    model = model.cuda()
    fast = ucudnn.torch.Inference(model, "squeezenet1_1", batch=2, sources="legacy", block_tuning_s=0)
    x = torch.randn(2, 3, 224, 224, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        want = torch.softmax(model(x), dim=1)
        a = fast(x)
        b = fast(torch.randn_like(x))   # the first result is a copy: the next call does not change it
    assert a.shape == want.shape and a.device == x.device
    torch.testing.assert_close(a, want, rtol=1e-3, atol=1e-6)
    assert not torch.equal(a, b)
