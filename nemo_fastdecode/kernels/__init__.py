"""Triton kernels, one file each: the @triton.jit kernel, its checked launcher and a torch reference."""
