"""Claim 1: work vs depth, measured with the dispatch tracer on the meta device (shapes only)."""
import torch

from attnlab.config import ModelConfig
from attnlab.cost.trace import trace
from attnlab.experiments.base import Outcome, Plot, Series, fit_exponent, verdict
from attnlab.models import build_model

TITLE = "Work vs depth"
CLAIM = ("An RNN does O(n) work in O(n) dependent steps; self-attention does O(n^2) work in a depth that "
         "does not grow with n.")
PREDICTION = ("Measured depth (longest chain of dependent ops) grows linearly in n for rnn, lstm, gru and the "
              "sequential SSM scan, like log n for the parallel scan, and not at all for the transformer, whose "
              "attention-score FLOPs grow like n^2.")
THRESHOLD = ("Supported if the depth exponent is >= 0.9 for rnn, lstm and gru, <= 0.05 for the transformer, and "
             "the transformer's attention-score FLOP exponent is >= 1.8.")

MODELS = {"transformer": dict(kernel="naive"), "rnn": dict(family="rnn"), "lstm": dict(family="lstm"),
          "gru": dict(family="gru"), "ssm-sequential": dict(family="ssm", scan="sequential", pos="none"),
          "ssm-parallel": dict(family="ssm", scan="parallel", pos="none")}


def run(scale: str, device: str) -> Outcome:  # shapes only: traced on "meta", whatever the device
    lens = [32, 64, 128, 256] if scale == "quick" else [64, 128, 256, 512, 1024, 2048]
    rows, depth_series, work_series, exps = [], [], [], {}
    for name, kw in MODELS.items():
        cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, max_seq_len=max(lens), **kw)
        with torch.device("meta"):
            model = build_model(cfg, device="meta")
        depths, works, attn = [], [], []
        for T in lens:
            r = trace(model, torch.zeros(1, T, dtype=torch.long, device="meta"))
            depths.append(r.depth)
            works.append(r.flops)
            attn.append(r.flops_by_op.get("bmm", 0))
            rows.append({"model": name, "n": T, "work_flops": r.flops, "depth_ops": r.depth, "ops": r.ops})
        exps[name] = {"depth": fit_exponent(lens, depths), "work": fit_exponent(lens, works)}
        if name == "transformer":
            exps[name]["attention_work"] = fit_exponent(lens, attn)
        depth_series.append(Series(name, lens, depths))
        work_series.append(Series(name, lens, works))
    rec = [exps[f]["depth"] for f in ("rnn", "lstm", "gru")]
    t = exps["transformer"]
    ok = min(rec) >= 0.9 and abs(t["depth"]) <= 0.05 and (t["attention_work"] or 0) >= 1.8
    figure = (f"depth exponent: transformer {t['depth']:.2f}, lstm {exps['lstm']['depth']:.2f}, "
              f"ssm parallel {exps['ssm-parallel']['depth']:.2f}; attention FLOPs exponent {t['attention_work']:.2f}")
    return Outcome(verdict(ok), figure, {"lengths": lens, "exponents": exps}, [
        Plot("Depth (dependent ops) vs n", "n (tokens)", "depth", depth_series, log_x=True, log_y=True),
        Plot("Work (FLOPs) vs n", "n (tokens)", "FLOPs", work_series, log_x=True, log_y=True)], rows,
        ["Depth counts dependent dispatched ops; a wide op counts as one step however much it computes. "
         "On real hardware a step's time also depends on its width."], device="meta")
