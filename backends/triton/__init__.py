"""The Triton backend: its ``tl.dot`` kernels, configs, launch and per-stream buffers."""
