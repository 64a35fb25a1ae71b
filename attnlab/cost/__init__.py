"""Cost model: what a prompt costs, predicted from the architecture and hardware, and measured.

- ``arch``: architectures (presets, attnlab configs, Hugging Face config.json)
- ``hardware``: datasheet specs and the calibrated ``local`` machine
- ``calibrate``: the micro-benchmarks behind ``local`` (at shapes no validated model uses)
- ``cpu``: predicted engine times on a CPU from those micro-benchmarks
- ``analytic``: parameters, FLOPs, bytes, KV cache, memory, depth, roofline latency
- ``trace``: measured work and depth from a dispatch-level tracer
- ``validate``: predicted vs measured on this machine, on held-out models
"""
from attnlab.cost.analytic import Workload, compare, estimate
from attnlab.cost.arch import Arch, resolve

__all__ = ["Arch", "Workload", "compare", "estimate", "resolve"]
