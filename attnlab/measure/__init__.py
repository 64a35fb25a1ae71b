"""Measuring this machine for the cost model: the client beside the experiments that runs the engine and times it.

``cost/`` is a pure library (calibration data in, seconds out); everything here runs code and reads a clock, through
``attnlab.timing``:

- ``micro``, ``calibrate``: the micro-benchmarks at shapes no validated model uses, and what they share;
- ``engine_timing``: the engine timed as a user waits for it, the overhead probe, the pace pulse;
- ``local``: the measured ``local`` hardware spec, cached on disk;
- ``trace``: the dispatch-level tracer that counts the ops a forward runs (claim 1's depth, the op counts);
- ``validate``, ``validation_log``: ``attnlab cost --validate`` and its record of every run.
"""
