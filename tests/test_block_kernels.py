"""kernels/blocks.py without a GPU: which fused-block kernels run a block (the FMA kernel always; in FP16 the
tensor-core kernels where their layer shapes allow), and the launcher's refusals before anything compiles."""
from __future__ import annotations

import pytest

from ucudnn.errors import InputError
from ucudnn.kernels import blocks as K
from ucudnn.kernels import pointwise as P
from ucudnn.kernels import spatial as S
from ucudnn.kernels.fused import DEFAULT_SMEM, SEED_BLOCKS, Block, ConvLayer


def test_the_fma_kernel_runs_every_block_and_fp16_adds_the_tensor_core_kernels_that_fit():
    assert {name: K.candidates(b, "float32", DEFAULT_SMEM) for name, b in SEED_BLOCKS.items()} == \
        {"a.1": ["fma"], "a.2": ["fma"], "b.1": ["fma"], "c.1": ["fma"]}
    assert {name: K.candidates(b, "float16", DEFAULT_SMEM) for name, b in SEED_BLOCKS.items()} == \
        {"a.1": ["fma", "spatial"], "a.2": ["fma"], "b.1": ["fma", "spatial"], "c.1": ["fma", "pointwise"]}
    # MobileNet V2's project -> next expand (960 -> 160 -> 960): the spatial kernel stages the producer's 160 x 960
    # filters whole, more shared memory than any device has; the pointwise kernel reads them from global memory
    wide = Block("project-expand", "straight", 960, (ConvLayer(160, 1, relu=False), ConvLayer(960, 1, relu6=True,
                                                                                                 relu=False)))
    assert K.candidates(wide, "float16", 227 << 10) == ["fma", "pointwise"]
    assert S.fitting(wide, 227 << 10) == []
    chain = Block("1x1-1x1", "straight", 32, (ConvLayer(64, 1), ConvLayer(32, 1)))
    assert K.candidates(chain, "float16", DEFAULT_SMEM) == ["fma", "pointwise", "spatial"]


def test_the_launcher_names_a_bad_kernel_or_tiling_before_compiling():
    with pytest.raises(InputError) as e:
        K.launcher("wmma", SEED_BLOCKS["a.1"], [4, 8, 8, 2], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "kernel"
    with pytest.raises(InputError) as e:
        K.launcher("spatial", SEED_BLOCKS["a.1"], [4, 8], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "tiling"
    with pytest.raises(InputError) as e:
        K.launcher("pointwise", SEED_BLOCKS["a.1"], [32, 4], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "block"


def test_untuned_tensor_core_kernels_run_their_default_tiling():
    ops = (None, [], [], None, None)
    assert K.tuned("spatial", SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 192, 28, 28), ops, False,
                   smem=DEFAULT_SMEM) == list(S.TILINGS[0])
    assert K.tuned("pointwise", SEED_BLOCKS["c.1"], "float16", "NCHW", (1, 64, 56, 56), ops, True, None,
                   smem=DEFAULT_SMEM) == list(P.TILINGS[0])
    # under a smaller limit the first tiling that fits it, not the default
    a1 = SEED_BLOCKS["a.1"]
    limit = S.smem_bytes(a1, 4, 4, 0)
    assert S.smem_bytes(a1, *S.TILINGS[0][:2], S.TILINGS[0][3]) > limit
    th, tw, nw, rtb = K.tuned("spatial", a1, "float16", "NCHW", (1, 192, 28, 28), ops, False, smem=limit)
    assert S.smem_bytes(a1, th, tw, rtb) <= limit and (th, tw, nw, rtb) == S.fitting(a1, limit)[0]
    with pytest.raises(InputError) as e:
        K.tuned("spatial", SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 192, 28, 28), ops, False, smem=1024)
    assert e.value.field == "tiling"
