"""ConvProblem as a key: equal problems hash alike, whatever object or process made them."""
from __future__ import annotations

import copy
import dataclasses
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.problem import ConvProblem

sizes = st.integers(1, 64)


@given(n=sizes, c=sizes, h=sizes, k=sizes, r=st.integers(1, 5), pad=st.integers(0, 2), stride=st.integers(1, 4),
       layout=st.sampled_from(["NCHW", "NHWC"]), dtype=st.sampled_from(["float32", "float16"]))
def test_equal_problems_hash_alike_and_a_changed_field_is_another_key(n, c, h, k, r, pad, stride, layout, dtype):
    p = ConvProblem(n, c, h + r, h + r, k, r, r, (pad, pad), (stride, stride), dtype=dtype, layout=layout)
    twin = ConvProblem(n, c, h + r, h + r, k, r, r, (pad, pad), (stride, stride), dtype=dtype, layout=layout)
    assert hash(p) == hash(twin) and p == twin
    assert {p: 1}[twin] == 1
    other = dataclasses.replace(p, n=n + 1)
    assert other != p and other not in {p}


def test_the_cached_hash_stays_out_of_pickles_copies_and_the_fields():
    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1), dtype="float16", layout="NHWC")
    hash(p)                                           # cached on the object now
    back = pickle.loads(pickle.dumps(p))
    assert "_hash" not in back.__dict__ and back == p and hash(back) == hash(p)
    assert copy.deepcopy(p) == p and hash(copy.deepcopy(p)) == hash(p)
    assert "_hash" not in dataclasses.asdict(p) and "_hash" not in repr(p)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(3, 7), st.integers(3, 7), st.integers(1, 5),
       st.integers(1, 3), st.integers(1, 3), st.sampled_from(["NCHW", "NHWC"]))
def test_x_and_w_strides_are_the_packed_arrays_strides_in_nchw_order(n, c, h, w, k, r, s, layout):
    import numpy as np

    p = ConvProblem(n, c, h, w, k, r, s, layout=layout)
    order = (0, 1, 2, 3) if layout == "NCHW" else (0, 3, 1, 2)       # (n, c, h, w) / (k, c, r, s) axes
    for shape, strides in ((p.x_shape(), p.x_strides()), (p.w_shape(), p.w_strides())):
        elem = np.empty(shape, np.float32).strides
        assert strides == tuple(elem[a] // 4 for a in order)
