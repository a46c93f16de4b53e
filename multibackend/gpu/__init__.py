"""The GPU plumbing the backends share: the CUDA driver, the toolchain, NVRTC, TMA tensor
maps, the native launch descriptions the compiled front runs, operand staging, the user cache
and timing."""
