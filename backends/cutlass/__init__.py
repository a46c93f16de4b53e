"""The CUTLASS backend: kernels emitted from Python by nvidia-cutlass's generator, built
with nvcc, launched through the CUDA driver."""
