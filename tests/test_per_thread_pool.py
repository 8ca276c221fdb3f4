"""ucudnn.binding.gpu.per_thread: what side streams and extra cuBLAS handles are kept in (CPU)."""
from __future__ import annotations

import threading

from ucudnn.binding.gpu import per_thread


def test_a_value_is_made_once_per_thread_and_key():
    made = []

    def make():
        made.append(object())
        return made[-1]

    first = per_thread("test_pool", (0, 1), make)
    assert per_thread("test_pool", (0, 1), make) is first and len(made) == 1
    assert per_thread("test_pool", (0, 2), make) is not first and len(made) == 2
    other = []
    t = threading.Thread(target=lambda: other.append(per_thread("test_pool", (0, 1), make)))
    t.start()
    t.join()
    assert other[0] is not first and len(made) == 3     # another thread gets its own
    assert per_thread("test_pool", (0, 1), make) is first
