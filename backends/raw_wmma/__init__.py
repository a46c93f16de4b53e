"""The raw WMMA backend: hand-written WMMA/wgmma CUDA kernels (sources in ``raw_wmma/``),
compiled with NVRTC and launched through the CUDA driver."""
