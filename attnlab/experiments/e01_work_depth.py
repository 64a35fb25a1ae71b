"""Claim 1: work vs depth, measured with the dispatch tracer on the meta device (shapes only).

Depth is read off the graph of ops the model really dispatches (each op one step deeper than its deepest input);
that is the measured half and the verdict rests on it. FLOPs are torch's per-op formulas applied to the traced
shapes: arithmetic on the shapes (the model), shown beside the depth but not part of the verdict.
"""
import torch

from attnlab.config import ModelConfig
from attnlab.cost.trace import trace
from attnlab.experiments.base import Decision, Outcome, Plot, Series, fit_exponent, verdict
from attnlab.models import build_model

TITLE = "Work vs depth"
CLAIM = ("An RNN does O(n) work in O(n) dependent steps; self-attention does O(n^2) work in a depth that "
         "does not grow with n.")
PREDICTION = ("Measured depth (longest chain of dependent ops) grows linearly in n for rnn, lstm, gru and the "
              "sequential SSM scan, like log n for the parallel scan, and not at all for the transformer, whose "
              "attention-score FLOPs grow like n^2.")
THRESHOLD = ("Supported if the traced depth exponent is >= 0.9 for rnn, lstm and gru and <= 0.05 for the "
             "transformer; inconclusive if an exponent cannot be fitted. The attention-score FLOP exponent is "
             "arithmetic on the traced shapes (model), shown but not part of the verdict.")
CHANGES = [
    {"date": "2026-11-30", "what": "threshold: the FLOP exponent leaves the verdict",
     "old": ("Supported if the depth exponent is >= 0.9 for rnn, lstm and gru, <= 0.05 for the transformer, and "
             "the transformer's attention-score FLOP exponent is >= 1.8."),
     "new": THRESHOLD,
     "why": ("The FLOPs come from torch's formulas applied to the shapes on the meta device, so their exponent is 2 "
             "by construction and could not fail; only the depth is read off the dispatched graph.")},
    {"date": "2026-11-30", "what": "method: quick scale traces n = 16..128 instead of 32..256",
     "why": ("Tracing a recurrent model costs time in proportion to n; the depth exponents are exact (one step per "
             "token, or none) at any n, so the quick run's time goes where verdicts need it. Full scale is unchanged.")},
]
EST_S = {"quick": 6, "full": 30}  # seconds on a 2-core CPU: the report's progress estimate

MODELS = {"transformer": dict(kernel="naive"), "rnn": dict(family="rnn"), "lstm": dict(family="lstm"),
          "gru": dict(family="gru"), "ssm-sequential": dict(family="ssm", scan="sequential", pos="none"),
          "ssm-parallel": dict(family="ssm", scan="parallel", pos="none")}
RECURRENT_MIN, TRANSFORMER_MAX = 0.9, 0.05  # the THRESHOLD above, as numbers


def measure(scale: str, device: str) -> dict:
    """Depth and FLOPs of one forward per model and length; ``device`` is unused: shapes are traced on "meta"."""
    lens = [16, 32, 64, 128] if scale == "quick" else [64, 128, 256, 512, 1024, 2048]
    depth, flops, rows, attn = {}, {}, [], []
    for name, kw in MODELS.items():
        cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, max_seq_len=max(lens), **kw)
        with torch.device("meta"):
            model = build_model(cfg, device="meta")
        depth[name], flops[name] = [], []
        for T in lens:
            r = trace(model, torch.zeros(1, T, dtype=torch.long, device="meta"))
            depth[name].append(r.depth)
            flops[name].append(r.flops)
            if name == "transformer":
                attn.append(r.flops_by_op.get("bmm", 0))
            rows.append({"model": name, "n": T, "work_flops": r.flops, "depth_ops": r.depth, "ops": r.ops})
    exps = {name: {"depth": fit_exponent(lens, depth[name]), "work": fit_exponent(lens, flops[name])} for name in MODELS}
    exps["transformer"]["attention_work"] = fit_exponent(lens, attn)
    return {"lengths": lens, "depth_ops": depth, "work_flops": flops, "exponents": exps, "rows": rows}


def decide(measured: dict) -> Decision:
    e = measured["exponents"]
    depth = {name: e[name]["depth"] for name in ("transformer", "rnn", "lstm", "gru")}
    if any(d is None for d in depth.values()):
        missing = [n for n, d in depth.items() if d is None]
        return Decision(verdict(None), "depth exponent not fitted for " + ", ".join(missing),
                        [f"depth exponent of {', '.join(missing)}: not fitted (fewer than two positive depths)"])
    reasons = [f"{n} depth exponent {depth[n]:.2f} >= {RECURRENT_MIN}: {'yes' if depth[n] >= RECURRENT_MIN else 'no'}"
               for n in ("rnn", "lstm", "gru")]
    flat = abs(depth["transformer"]) <= TRANSFORMER_MAX
    reasons.append(f"transformer |depth exponent| {abs(depth['transformer']):.2f} <= {TRANSFORMER_MAX}: "
                   f"{'yes' if flat else 'no'}")
    attn = e["transformer"].get("attention_work")
    if attn is not None:
        reasons.append(f"model (not in the verdict): attention-score FLOP exponent {attn:.2f} (shape arithmetic)")
    ok = flat and all(depth[n] >= RECURRENT_MIN for n in ("rnn", "lstm", "gru"))
    par = e.get("ssm-parallel", {}).get("depth")
    figure = (f"depth exponent: transformer {depth['transformer']:.2f}, lstm {depth['lstm']:.2f}"
              + (f", ssm parallel {par:.2f}" if par is not None else "")
              + (f"; attention FLOPs exponent {attn:.2f} (model)" if attn is not None else ""))
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:  # shapes only: traced on "meta", whatever the device
    m = measure(scale, device)
    lens = m["lengths"]
    return Outcome.of(decide(m), {k: m[k] for k in ("lengths", "exponents", "depth_ops", "work_flops")}, [
        Plot("Depth (dependent ops) vs n", "n (tokens)", "depth", [Series(k, lens, v) for k, v in m["depth_ops"].items()],
             log_x=True, log_y=True),
        Plot("Work (FLOPs, model: formulas on traced shapes) vs n", "n (tokens)", "FLOPs",
             [Series(k, lens, v) for k, v in m["work_flops"].items()], log_x=True, log_y=True)], m["rows"],
        ["Depth counts dependent dispatched ops; a wide op counts as one step however much it computes. "
         "On real hardware a step's time also depends on its width.",
         "FLOPs are torch's counting formulas applied to the traced shapes: a model, not a measurement."], device="meta")
