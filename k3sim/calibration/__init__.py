"""GPU measurement harness (`k3sim calibrate run`).

Runs real kernels (cuBLAS GEMMs, HBM copies, grouped MoE GEMMs, flash-linear-attention's KDA kernels,
SDPA attention, NCCL collectives, fla's KDA context parallelism) and writes one CSV per op plus a
provenance file. Needs torch (and fla-core for the KDA parts); nothing else in k3sim imports this package.
Only the standard library and torch are used here, so the harness runs on a bare GPU image.
"""
