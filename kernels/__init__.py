"""ucudnn.kernels: ucudnn's own CUDA kernels (sources beside this file) and their launchers.

Installed as ``ucudnn.kernels``.
"""
