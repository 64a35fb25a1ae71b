"""Cost model, a pure library: what a prompt costs, predicted from the architecture and the hardware.

- ``arch``: architectures (attnlab configs, Hugging Face config.json, the published ones a user may name)
- ``hardware``: datasheet specs, interconnects, a measured spec from calibration figures
- ``cpu``: predicted engine times on a CPU from the calibration's micro-benchmarks
- ``analytic``: parameters, FLOPs, bytes, KV cache, memory, depth, roofline latency
- ``parallel``: plans across devices

Measuring (the micro-benchmarks, the engine timed whole, the tracer, the held-out validation) lives in
attnlab/measure; a name or path becomes an ``Arch`` through attnlab/resolve.py.
"""
from attnlab.cost.analytic import Workload, compare, estimate
from attnlab.cost.arch import Arch

__all__ = ["Arch", "Workload", "compare", "estimate"]
