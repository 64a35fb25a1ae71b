"""Claim 7: at typical lengths the feed-forward network, not attention, dominates a layer's time."""
import torch
import torch.nn.functional as F

from attnlab.cost.analytic import crossover_tokens
from attnlab.cost.arch import resolve
from attnlab.experiments.base import Outcome, Plot, Series, median_time, verdict

TITLE = "Feed-forward dominates at typical lengths"
CLAIM = "In a GPT-2-sized layer the MLP costs more than attention's score and weighted-sum work until n is several thousand tokens."
PREDICTION = ("Measured MLP time exceeds the attention core's (scores + softmax + weighted sum) at n <= 1024; the "
              "analytic FLOP crossover for GPT-2 small is 8*d - 1 = 6143 tokens.")
THRESHOLD = "Supported if the MLP takes longer than the attention core at every measured n <= 1024."


def run(scale: str, device: str) -> Outcome:
    d, H = 768, 12
    lens = [256, 512, 1024, 2048] if scale == "quick" else [256, 512, 1024, 2048, 4096, 8192]
    w1, w2 = (torch.randn(4 * d, d) * 0.02).to(device), (torch.randn(d, 4 * d) * 0.02).to(device)
    wqkv, wo = (torch.randn(3 * d, d) * 0.02).to(device), (torch.randn(d, d) * 0.02).to(device)
    rows, mlp_t, core_t, proj_t = [], [], [], []
    with torch.inference_mode():
        for T in lens:
            x = torch.randn(1, T, d).to(device)
            q, k, v = (torch.randn(1, H, T, d // H).to(device) for _ in range(3))
            m = median_time(lambda: F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2), 3, device=device)
            c = median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3, device=device)
            p = median_time(lambda: F.linear(F.linear(x, wqkv)[..., :d], wo), 3, device=device)
            mlp_t.append(m)
            core_t.append(c)
            proj_t.append(p)
            rows.append({"n": T, "mlp_s": m, "attention_core_s": c, "attention_projections_s": p,
                         "core_share_of_layer": c / (m + c + p)})
    cross = None
    for (T0, m0, c0), (T1, m1, c1) in zip(zip(lens, mlp_t, core_t), zip(lens[1:], mlp_t[1:], core_t[1:])):
        if c0 < m0 and c1 >= m1:  # linear interpolation of the gap
            g0, g1 = m0 - c0, m1 - c1
            cross = T0 + (T1 - T0) * g0 / (g0 - g1)
    analytic = crossover_tokens(resolve("gpt2"))
    ok = all(m > c for T, m, c in zip(lens, mlp_t, core_t) if T <= 1024)
    fig = (f"at n=1024 the attention core is {rows[min(2, len(rows) - 1)]['core_share_of_layer']:.0%} of the layer; measured crossover "
           f"{'%.0f' % cross if cross else 'beyond ' + str(lens[-1])} vs analytic {analytic:.0f}")
    return Outcome(verdict(ok), fig, {"measured_crossover": cross, "analytic_crossover": analytic, "rows": rows},
                   [Plot("GPT-2 layer parts vs n", "n (tokens)", "seconds", [Series("MLP", lens, mlp_t),
                         Series("attention core", lens, core_t), Series("q/k/v/out projections", lens, proj_t)],
                         log_x=True, log_y=True)], rows,
                   ["The analytic crossover counts FLOPs; measured times also reflect how efficiently this machine "
                    "runs each kernel (torch's fused CPU attention vs MKL matmuls)."])
