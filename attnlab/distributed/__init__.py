"""Beyond one process, on torch.distributed: process groups, data-parallel wrapping, ring attention.

- ``group``: join the process group torchrun (or ``attnlab train --nproc``) describes; run a function on P
  local ranks (tests, experiments, benchmarks) with failures reported by rank
- ``parallel``: the one place a built model is wrapped (DDP, FSDP2 ``fully_shard``, sequence parallel), the
  global batch split across ranks, and the full state gathered for rank 0's checkpoint
- ``ring``: exact ring attention (zig-zag chunks, log-sum-exp merge), forward and backward
- ``scan``: the SSM's linear recurrence split across ranks (chunk scans, exchanged summaries, a correction)
- ``launch``: ``--nproc N``: N local processes under a watchdog

The model knows nothing about parallelism (torchtitan's rule): it is applied from outside, in parallel.py.
"""
