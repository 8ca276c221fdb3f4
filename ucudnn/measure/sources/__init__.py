"""Algorithm sources: where micro-configurations come from (legacy cuDNN, graph-API engines, own kernels)."""
