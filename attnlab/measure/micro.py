"""What every calibration micro-benchmark shares: the shapes it may run (``CALIBRATION``), its timer (``timed``: the
timing module's clock, with a cancellation check before each repeat) and the cancellation itself (``Cancelled``).

Kept apart from calibrate.py so that engine_timing.py (the overhead probe and the pace pulse, which the calibration
runs) and calibrate.py both read it without importing each other."""
from __future__ import annotations

import threading

from attnlab.timing import time_calls

MiB = 2 ** 20
# Shapes of every calibration micro-benchmark. ``attnlab cost --validate`` checks that none of them is a shape its
# validation models run (validate.shapes_of_config), and the tests check it too.
CALIBRATION = {
    "widths": (96, 320, 1280),  # W: a layer's matrices W x 3W, W x W, W x 4W, 4W x W
    "prefill_rows": (48, 320, 1536),  # M for the prefill matmul table (skipped above PREFILL_FLOP_CAP)
    "decode_rows": (1, 8),  # rows of the decode (weight-streaming) table (docs/cost.md: a 4-row entry did not help)
    # Total weights cycled through by the decode table: up to 640 MiB, beyond a server CPU's last-level cache
    # (hundreds of MiB), so the largest sets read from DRAM as a large model's decode does; a table that stops
    # inside the cache predicts every larger model too fast.
    "working_sets_mib": (1, 4, 16, 64, 160, 640),
    # Heads of every attention call: as many as a small model's (GPT-2 small has 12). A call's cost beyond its floor
    # (the tiny shape's) grows by a fixed cost per head as well as by the head's arithmetic, and with 3 heads the
    # floor held a larger share of it: short bf16 prefills were predicted 2-3x too fast per head.
    "attention_heads": 12,
    "attention_tokens": (96, 384, 1536),  # T of a causal prefill SDPA call
    # Whole vectors each (16 fp32 lanes with AVX-512, 8 with AVX2), as the validated 32 and 64 are: at 24 the
    # compiled prefill kernel did not apply (torch's ran instead) and the decode kernel ran a lane tail, 5-7 GB/s
    # against 16-18 at 48, and a head_dim-32 decode interpolated between the two was predicted 2.5x slow.
    "attention_head_dims": (16, 48, 96),
    "attention_keys": (40, 400, 4000),  # S cached keys of a one-query decode SDPA call
    "elementwise_rows": (1, 8, 48, 320, 1536),  # M x W of the elementwise layer mix (skipped above 2M elements)
    "probe": {"dim": 16, "n_heads": 2, "vocab_size": 32, "layers": (1, 16), "batch": (1, 6), "prompt": 24,
              "new_tokens": 17},
    # Whole models the engine runs in a fresh process, as a validation case is run, to measure how far the engine
    # is from the sum of its parts (cost.cpu.composition): (dim, heads, layers), at widths no validation draws (it
    # draws multiples of 64 from 128 to 1,024) and head dims it never uses (it uses 32 and 64), each at two depths
    # near the ends of the validated range, because the ratio moves with depth as well as width: a 2-layer model's
    # step is mostly the engine's fixed cost, a 10-layer one's mostly its layers (docs/cost.md).
    # Their head dims (16, 80) are whole vectors too, as the attention table's (above) and the validated ones are.
    "composition": {"models": ((160, 10, 2), (160, 10, 10), (800, 10, 2), (800, 10, 10)), "prompt": 128, "batch": 2,
                    "new_tokens": 17, "repeats": 3, "processes": 3},
    "floor_width": 16,  # the tiny shape of each floor
    "cold_mib": (0, 0.5, 2, 8, 32),  # bytes streamed just before the floor's mix, for the cold-dispatch table
    # The head and sampler table's vocabulary: not one a validation draws (256 or GPT-2's 50,257), as large as
    # Llama's, so that per-logit and per-weight figures carry to both.
    "head_vocab": 32000,
}


class Cancelled(Exception):
    """A calibration stopped on request before its end (a server shutting down); nothing of it is kept."""


# The Event that may stop the calibration running on this thread (run's ``cancel``), looked at before every timed
# repeat, so a request to stop waits for one repeat (well under a second), not for the minutes of the whole table.
_cancel = threading.local()


def check_cancel() -> None:
    event = getattr(_cancel, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("the calibration was cancelled before its end")


def timed(fn, repeats: int = 5, warm: int = 1, inner: int = 1) -> dict:
    """Median wall and CPU seconds of ``fn`` (called ``inner`` times per repeat, per call) after ``warm`` calls, and
    the fastest repeat's wall seconds; a cancelled calibration stops before the next repeat."""
    t = time_calls(fn, repeats, warm, inner=inner, before=check_cancel)
    return {"wall": t["median_s"], "cpu": t["cpu_s"], "wall_min": t["min_s"]}


FLOOR_SERIES = 3


def floor_timed(fn, repeats: int = 7, inner: int = 20, series: int = FLOOR_SERIES) -> dict:
    """A floor (the cost of calling a kernel at a tiny shape, which the tables are taken above): the fastest of
    ``series`` medians, each as ``timed`` gives it. Why: one median swung up to 2x between the calibrations of one run
    (docs/cost.md has the figures), and cost.cpu uses floors' differences (a dtype's extra dispatch) and subtracts them
    from the tables, where a floor above a product's time left a bytes/s read off a clamped difference. Calling a
    kernel cannot cost less than it does at its fastest, so the least median is the floor."""
    runs = [timed(fn, repeats, warm=1 if i == 0 else 0, inner=inner) for i in range(series)]
    return {k: min(r[k] for r in runs) for k in runs[0]}


def watch(event: threading.Event | None) -> None:
    """Make ``event`` (None: none) the one that stops the calibration running on this thread."""
    _cancel.event = event
