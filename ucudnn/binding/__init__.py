"""Binding layer: ctypes over libcudnn (:mod:`.cudnn`) and the CuPy plumbing every GPU layer shares (:mod:`.gpu`).

The bottom of the stack.  ``cudnn`` imports nothing but ctypes and ucudnn's
errors (CuPy 14 has no ``cupy.cuda.cudnn``, so ucudnn keeps its own thin
binding, in the manner of ``cupy.cuda``'s); ``gpu`` holds the per-device
handle, descriptors, streams and CUDA-graph capture, importing CuPy lazily so
that ``import ucudnn`` works without a GPU.
"""
