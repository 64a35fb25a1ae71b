"""Claim 8: the remedies for quadratic cost trade exactness or recall for speed and memory.

One set-up for both halves: the sliding window timed is the window the recall model is trained with, and the
block-sparse kernel is timed and trained with the same rule for its block (sqrt(n) tokens). Each repetition pairs
one timing round (every kernel at every length) with one training seed of the recall models, and is decided alone.
"""
import torch

from attnlab.experiments import recall
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, fit_exponent, in_regime, mean,
                                      over_repeats, plausible_exponent, SHOWN, verdict)
from attnlab.timing import time_calls
from attnlab.models.attention import KERNELS
from attnlab.models.linear import linear_parallel, phi
from attnlab.models.sparse import default_block, pairs_scored
from attnlab.models.ssm import selective_scan

TITLE = "The remedies' trade"
CLAIM = ("Sliding-window, block-sparse, linear attention and state-space models cut attention's quadratic cost, "
         "and pay for it in what they can recall.")
PREDICTION = ("At long n their time grows with exponents near 1 (block_sparse ~1.5) against ~2 for exact attention; on "
              "MQAR, models with a bounded window or fixed-size state recall less than exact attention at equal budget.")
THRESHOLD = ("Each repetition (one timing round, one recall seed) is decided alone: supported if exact attention's time "
             "exponent is >= 1.6 (claim 6's bar for ~2), every remedy's is below it and near its predicted one (nearer "
             "it than exact attention's 2 by 0.1: <= 1.4 for the window, linear attention and the SSM, <= 1.65 for "
             "block_sparse), and exact attention's MQAR accuracy at the largest pair count is "
             "above linear attention's and the SSM's by more than 5 points, the models with a fixed-size state the "
             "prediction names; the sliding window's and block_sparse's recall aside (the window's is bounded by its "
             "reach, layers x window tokens, whatever it learns; block_sparse has neither a bounded window nor a fixed "
             "state, so the prediction says nothing of its recall: shown, not decided). Not supported if a check fails "
             "(exact attention's exponent below 1.6, a remedy's not below it or at least midway to 2 from its "
             "predicted one: >= 1.5, block_sparse >= 1.75; or a decided remedy recalling as well or better); "
             "inconclusive if a remedy's exponent lies between its bound and the midway point, a "
             "recall difference is within 5 points or a fitted exponent is physically implausible (below 0.5, or an "
             "O(n*sqrt(n)) or quadratic kernel below 1: a measuring fault, not a result). Repetitions that disagree "
             "make the verdict inconclusive (unstable).")
# The threshold of 2026-12-06, kept as it was (CHANGES quotes it): exponents only below exact attention's.
THRESHOLD_1206 = ("Each repetition (one timing round, one recall seed) is decided alone: supported if every remedy's time "
             "exponent is below exact attention's and exact attention's MQAR accuracy at the largest pair count is "
             "above linear attention's and the SSM's by more than 5 points, the models with a fixed-size state the "
             "prediction names; the sliding window's and block_sparse's recall aside (the window's is bounded by its "
             "reach, layers x window tokens, whatever it learns; block_sparse has neither a bounded window nor a fixed "
             "state, so the prediction says nothing of its recall: shown, not decided). Not supported if a check fails "
             "(a remedy's exponent not below, or a decided remedy recalling as well or better); inconclusive if a "
             "recall difference is within 5 points or a fitted exponent is physically implausible (below 0.5, or an "
             "O(n*sqrt(n)) or quadratic kernel below 1: a measuring fault, not a result). Repetitions that disagree "
             "make the verdict inconclusive (unstable).")
REGIME = ("The trade is judged where each half applies: every model whose recall is decided has learned recall (exact "
          "attention >= 90% MQAR accuracy at the smallest pair count, linear attention and the SSM each >= 50% there, "
          "in the same seed), so a remedy's lower recall at the largest count is the remedy's limit, not a model that "
          "never learned the task; and n is long for the window that is timed and trained (every timed length >= 32x "
          "the sliding window), so the window's O(n*w) cost can show its exponent near 1.")
THRESHOLD_1205 = ("Each repetition (one timing round, one recall seed) is decided alone: supported if every remedy's "
                  "time exponent is below exact attention's and exact attention's MQAR accuracy at the largest pair "
                  "count is above every remedy's by more than 5 points, the sliding window's aside (its recall is "
                  "bounded by its reach, layers x window tokens, whatever it learns: shown, not decided). Not "
                  "supported if a check fails (a remedy's exponent not below, or a remedy recalling as well or "
                  "better); inconclusive if a recall difference is within 5 points or a fitted exponent is physically "
                  "implausible (below 0.5, or an O(n*sqrt(n)) or quadratic kernel below 1: a measuring fault, not a "
                  "result). Repetitions that disagree make the verdict inconclusive (unstable).")
THRESHOLD_1202 = ("Each repetition (one timing round, one recall seed) is decided alone: supported if every remedy's "
                  "time exponent is below exact attention's and exact attention's MQAR accuracy at the largest pair "
                  "count is above every remedy's by more than 5 points. Not supported if a check fails (a remedy's "
                  "exponent not below, or a remedy recalling as well or better); inconclusive if a recall difference "
                  "is within 5 points or a fitted exponent is physically implausible (below 0.5, or an O(n*sqrt(n)) or "
                  "quadratic kernel below 1: a measuring fault, not a result). Repetitions that disagree make the "
                  "verdict inconclusive (unstable).")
REGIME_1205 = ("The trade is judged where each half applies: every model whose recall is decided has learned recall "
               "(exact attention >= 90% MQAR accuracy at the smallest pair count, block_sparse, linear attention and "
               "the SSM each >= 50% there, in the same seed), so a remedy's lower recall at the largest count is the "
               "remedy's limit, not a model that never learned the task; and n is long for the window that is timed "
               "and trained (every timed length >= 32x the sliding window), so the window's O(n*w) cost can show its "
               "exponent near 1.")
THRESHOLD_1130 = ("Supported if every remedy's time exponent is below exact attention's and exact attention's MQAR "
                  "accuracy at the largest pair count is above every remedy's by more than the seed spread. Not "
                  "supported if a check fails; inconclusive if no model reaches 50% MQAR accuracy (too little "
                  "training), a recall difference is within the seed spread, or a fitted exponent is physically "
                  "implausible (below 0.5, or an O(n*sqrt(n)) or quadratic kernel below 1: a measuring fault, not a "
                  "result).")
REGIME_1202 = ("The trade is judged where each half applies: exact attention has learned recall (>= 90% MQAR accuracy "
               "at the smallest pair count, in the same seed), so a remedy's lower recall is the remedy's, not "
               "untrained models'; and n is long for the window that is timed and trained (every timed length >= 32x "
               "the sliding window), so the window's O(n*w) cost can show its exponent near 1.")
CHANGES = [
    {"date": "2026-11-29", "what": "An inconclusive gate was added after the first results were seen.",
     "old": "Supported if every remedy's time exponent is below exact attention's and exact attention's MQAR accuracy "
            "is >= every remedy's.",
     "new": "... ; inconclusive if no model reaches 50% MQAR accuracy (too little training).",
     "why": "No model learned MQAR (all near chance). Recorded here on 2026-11-30: the change was not written down "
            "when it was made (verdict then: inconclusive)."},
    {"date": "2026-11-30", "what": "Recall trained per Zoology's recipe (shared with claim 3); timing warmed up and "
                                   "repeated; implausible fits and differences within the seed spread are inconclusive.",
     "old": "... and exact attention's MQAR accuracy is >= every remedy's; inconclusive if no model reaches 50% MQAR "
            "accuracy (too little training).",
     "new": THRESHOLD_1130,
     "why": "Exponents came from 2 repeats with no warm-up (block_sparse fitted 0.68, below linear, and passed); "
            "recall was 200 steps at one learning rate, so nobody learned it."},
    recall.SSM_INIT_CHANGE,  # also in claim 3's CHANGES, from when it trained the same SSM
    {"date": "2026-12-01", "what": "method: what the exact kernel's timing runs (prediction and threshold unchanged)",
     "old": "sdpa = torch's scaled_dot_product_attention",
     "new": "sdpa = attnlab's compiled causal prefill attention for a causal fp32 call on a CPU outside autograd "
            "(kernels/prefill_attention.cpp, 0.5-0.8x torch's flash kernel's time on GPT-2 small's heads here), "
            "torch's kernel otherwise (GPU, training, other dtypes)",
     "why": "Issue 11: the engine's prefill now runs it, and the report times the kernel the engine runs. Still an "
            "exact O(n^2) attention; verdict at quick scale after the change: supported (sdpa exponent 1.86)."},
    {"date": "2026-12-02", "what": "method and threshold: one window (8) for the speed and the recall half; each repetition "
                                   "(a timing round and a recall seed) decided alone with a 5-point recall margin; a regime",
     "old": THRESHOLD_1130,
     "new": THRESHOLD_1202 + " Regime: " + REGIME_1202,
     "why": ("Issue 29: the speed half timed a window of 256 while the recall half trained a window of 8, so the two "
             "halves judged different remedies; a verdict needs 3 independent repetitions that agree; and the trade is "
             "only meaningful where exact attention has learned recall and n is long for the window. Verdict before: "
             "supported (reference run at b1a35cb); after: quick run inconclusive (1 repetition), full run not yet "
             "made.")},
]

CHANGES.append(
    {"date": "2026-12-05", "what": "regime and threshold: every model whose recall is decided must have learned it; "
                                   "the sliding window's recall shown, not decided",
     "old": THRESHOLD_1202 + " Regime: " + REGIME_1202, "new": THRESHOLD_1205 + " Regime: " + REGIME_1205,
     "why": ("Issue 29's independent read: with exact attention alone checked, the remedies' lower recall could be "
             "models that never learned the task, and in the reference they had not: at 4 pairs block_sparse, linear "
             "and the SSM scored 28-43% (about what guessing among the 4 values in the context gives) and the sliding "
             "window 10%, against exact attention's 100% (679adec). Their recall at 16 pairs then says nothing about "
             "the remedies' limit. The guide's rule is to fix the training, not the threshold: until every remedy "
             "learns the small case (Zoology's recipe reaches it with wider models and longer training), the recall "
             "half is outside its regime. The sliding window (8 tokens, 2 layers: a reach of about 14 tokens in "
             "64-token sequences) cannot see most keys at any pair count, so its low recall holds by construction: "
             "it is shown and neither decided nor required to learn. Prediction unchanged. Verdict before: supported "
             "(679adec, 3 of 3 repetitions); after, on the same data: inconclusive (regime not reached).")})
CHANGES.append(recall.SHORT_CONV_CHANGE)  # also in claim 3's CHANGES, from when it trained the same models
CHANGES.append(
    {"date": "2026-12-06", "what": "method: linear attention's sweep starts at its best rate's neighbours; the sliding "
                                   "window trained on one seed (prediction, threshold and regime unchanged)",
     "old": "every family's sweep starts at 3e-4, 1e-3, 3e-3 (extended past an end while the best sits there); 3 seeds "
            "for every family",
     "new": "linear attention's starts at 3e-3, 9e-3, 2.7e-2 (the same extension rule); the sliding window, whose "
            "recall is shown and not decided, trains seed 0 only and that one figure is shown beside each repetition",
     "why": ("The report must fit in an hour on 2 cores. In the reference at dc0f0f6 linear attention's sweep was "
             "extended twice (3e-3 0.967, 9e-3 0.988, 2.7e-2 0.956 validation accuracy, best 9e-3): starting there "
             "trains the same three rates on the same seed without the two below (145 job-seconds). The sliding "
             "window's two further seeds (134 job-seconds) fed no decision. Verdict before: "
             "inconclusive (regime not reached: block_sparse and the SSM at 29% at 4 pairs, 3 of 3 repetitions); "
             "after: the reference run that follows this change.")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: a decided family's seeds 1 and 2 train only if its seed 0 reached the "
                                   "regime's bar; the sliding window at one rate (prediction, threshold and regime "
                                   "unchanged)",
     "old": "every decided family trains 3 seeds at its best rate; the sliding window sweeps 3e-4, 1e-3, 3e-3 on seed 0",
     "new": "a decided family trains seeds 1 and 2 only if seed 0, at its best rate, reads at least the regime's bar "
            "(exact attention 90%, a remedy 50%) at the smallest pair count on the test draw, the very figure the "
            "regime reads; otherwise its repetitions 2 and 3 show it as not trained (not measured, so outside the "
            "regime). The sliding window trains 1e-3 only",
     "why": ("The report must fit in an hour on 2 cores. Every repetition outside the regime makes the verdict "
             "'inconclusive (regime not reached)' (base.over_repeats), so once a family's seed 0 misses the bar no "
             "other seed can change the verdict: in the reference at c5f2b2d the SSM's and block_sparse's seeds 1 and "
             "2 (296 job-seconds) read 29% like seed 0. The sliding window's sweep read 7% at every rate (6.9%, 7.6%, "
             "7.4% on validation) and its recall is shown, not decided (155 job-seconds for its two other rates). "
             "Verdict before: inconclusive (regime not reached: block_sparse and the SSM at 29% at 4 pairs, 3 of 3 "
             "repetitions); after: the reference run that follows this change.")})
CHANGES.append(recall.SSM_GATE_CHANGE)  # also in claim 3's CHANGES, which shows the same SSM's gradient
CHANGES.append(
    {"date": "2026-12-06", "what": "threshold and regime: block_sparse's recall shown, not decided (as the sliding "
                                   "window's)",
     "old": THRESHOLD_1205 + " Regime: " + REGIME_1205, "new": THRESHOLD_1206 + " Regime: " + REGIME,
     "why": ("The threshold decided more than the prediction says. The prediction, fixed before measuring, is that "
             "'models with a bounded window or fixed-size state recall less than exact attention': the sliding "
             "window, linear attention and the SSM. block_sparse is neither: what it attends grows with n. What it "
             "can recall in these 2-layer models is a property of its fixed pattern at this depth, which the claim "
             "does not state: an earlier block reaches a query only through summary positions (one per block, the "
             "strided column), each carrying what its layer-1 heads pick from its block (4 heads, position-selected "
             "under RoPE, values position-free), so it carries a few of its block's tokens, not all its bindings; "
             "only the first queries share a block with the context's tail. And it did not learn the task with this "
             "recipe: 28.7% at 4 pairs (about guessing among the 4 values in context) at every rate (3e-4 to 3e-3) "
             "and seed in every reference run, 28% with 4 layers at 1e-3 (a probe). Deciding it would put the claim "
             "outside its regime for a model the prediction never named. It stays on the page beside each "
             "repetition, with its figure. Linear attention and the SSM, the fixed states Zoology compares with "
             "attention, stay decided. Prediction unchanged. Verdict before: inconclusive (regime not reached: "
             "block_sparse and the SSM at 29% at 4 pairs; b8ee285); after, on the same data: inconclusive (regime "
             "not reached: the SSM at 29%); after the SSM's gate as well (the entry above): the reference run that "
             "follows these changes.")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: the SSM's sweep starts at 1e-3; block_sparse trains one seed at one rate "
                                   "(prediction, threshold and regime as in the entry above)",
     "old": "the SSM's sweep 3e-4, 1e-3, 3e-3; block_sparse's 3e-4, 1e-3, 3e-3, seeds 1 and 2 gated at 50%",
     "new": "the SSM's sweep 1e-3, 3e-3, 9e-3 (the same extension rule, which still reaches below 1e-3 if that were "
            "best); block_sparse seed 0 at 1e-3 only",
     "why": ("The report must fit in an hour on 2 cores. With its gate open the SSM read 29% at 1e-3 and 99% at "
             "3e-3 at 4 pairs (probes, seed 0), so its best lies at 3e-3 or above and a sweep from 3e-4 would spend "
             "a run below and another past its top (about 75 job-seconds each); passing its gate, it now also trains "
             "seeds 1 and 2 (about 150 job-seconds). block_sparse's recall is shown, not decided, and 1e-3 was its "
             "best rate in every reference run (about 74 job-seconds saved). Verdict before and after: as in the "
             "entry above.")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: the SSM's sweep starts at 3e-3 (prediction, threshold and regime unchanged)",
     "old": "the SSM's sweep 1e-3, 3e-3, 9e-3",
     "new": "the SSM's sweep 3e-3, 9e-3, 2.7e-2 (the same extension rule, which still reaches below 3e-3 if that "
            "were best)",
     "why": ("The report must fit in an hour on 2 cores (71 min on a 2-core AMD EPYC at 3c4b14b). There the SSM's "
             "sweep was extended once past its top (1e-3 0.19, 3e-3 0.90, 9e-3 0.94, 2.7e-2 0.03 validation "
             "accuracy, best 9e-3): these three rates bracket that best without the run at 1e-3 (about 100 "
             "job-seconds). Verdict before: supported (3c4b14b); after: the reference run that follows this change.")})
CHANGES.append(
    {"date": "2026-12-07", "what": "threshold: each remedy's exponent decided near its predicted one, not only below "
                                   "exact attention's",
     "old": THRESHOLD_1206,
     "new": THRESHOLD,
     "why": ("Issue 29's independent read: the prediction says the remedies grow 'with exponents near 1 (block_sparse "
             "~1.5)', and the threshold asked only that they be below exact attention's (~2), so a remedy growing like "
             "n^1.8 would have passed. 'Near' is read as nearer the predicted exponent than exact attention's 2, by 0.1 "
             "(<= 1.4 for the window, linear attention and the SSM; <= 1.65 for block_sparse; at or past midway, 1.5 "
             "and 1.75, refuted; between, inconclusive), and exact attention's '~2' is decided too (>= 1.6, claim 6's "
             "bar). Set after the data were seen: the reference b1c16d5's exponents over 3 rounds were sdpa "
             "1.93-1.97, sliding 1.04-1.12, block_sparse 1.45-1.48, linear 1.15-1.24, SSM 0.95-1.02. Prediction and regime unchanged. Verdict before: supported (3 of "
             "3 repetitions); after, on the same data: supported (3 of 3).")})
REMEDIES = ("sliding", "block_sparse", "linear", "ssm")
RECALL_DECIDED = ("linear", "ssm")
RECALL_SHOWN = ("sliding", "block_sparse")  # recall shown, not decided (THRESHOLD says why), on one seed
# Quick scale trains a bounded window and a fixed state (sliding, linear); block_sparse and the SSM are trained
# at full scale (their time exponents are measured at both).
RECALL_MODELS = {"quick": ("transformer", "sliding", "linear"), "full": ("transformer",) + REMEDIES}
# The lowest exponent each kernel can physically show at long n (its asymptotic growth, less noise).
LOWEST = {"sdpa": 1.0, "flash": 1.0, "sliding": 0.5, "block_sparse": 1.0, "linear": 0.5, "ssm": 0.5}
EST_S = {"quick": 3, "full": 60}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 30, "full": 700}  # this claim's share of the training stage (training.py), in seconds
WINDOW = recall.MODEL_FIELDS["sliding"]["window"]  # the recall model's window: the one timed
RECALL_MARGIN, MIN_N_PER_WINDOW = 0.05, 32
PREDICTED = {"sliding": 1.0, "block_sparse": 1.5, "linear": 1.0, "ssm": 1.0}  # the PREDICTION's exponents
# "Near" its predicted exponent: nearer it than exact attention's 2, by NEAR_BUFFER (the THRESHOLD above)
NEAR_BUFFER, EXACT_MIN = 0.1, 1.6  # EXACT_MIN: exact attention's "~2", claim 6's bar
MIDWAY = {k: (e + 2.0) / 2 for k, e in PREDICTED.items()}  # at or past it, nearer 2 than the prediction: refuted
NEAR_BOUND = {k: m - NEAR_BUFFER for k, m in MIDWAY.items()}
LEARNED, REMEDY_LEARNED = recall.LEARNED, recall.REMEDY_LEARNED  # the regime's bars; the training stage gates on them


def _times(lens, device, repeats, warmup=1, H=4, D=64):
    out = {k: [] for k in ("sdpa", "flash", "sliding", "block_sparse", "linear", "ssm")}
    spreads = {k: [] for k in out}

    def timed(name, fn):
        t = time_calls(fn, repeats, warmup=warmup, device=device)
        out[name].append(t["median_s"])
        spreads[name].append([t["min_s"], t["max_s"]])

    for T in lens:
        q, k, v = (torch.randn(1, H, T, D).to(device) for _ in range(3))
        kw = dict(causal=True, alibi_slopes=None, scale=D ** -0.5)
        with torch.inference_mode():
            timed("sdpa", lambda: KERNELS["sdpa"](q, k, v, **kw))
            timed("flash", lambda: KERNELS["flash"](q, k, v, **kw))
            timed("sliding", lambda: KERNELS["sliding"](q, k, v, window=WINDOW, **kw))
            timed("block_sparse", lambda: KERNELS["block_sparse"](q, k, v, block_size=default_block(T), **kw))
            fq, fk = phi(q), phi(k)
            timed("linear", lambda: linear_parallel(fq, fk, v, torch.zeros(1, H, D, D, device=device),
                                                    torch.zeros(1, H, D, device=device), 64))
            E, N = H * D, 16
            u = q.transpose(1, 2).reshape(1, T, E)  # (1, T, H*D)
            dl = torch.nn.functional.softplus(k.transpose(1, 2).reshape(1, T, E))
            B_, C_ = torch.randn(1, T, N).to(device), torch.randn(1, T, N).to(device)
            A = -torch.arange(1, N + 1, device=device).float().repeat(E, 1)
            timed("ssm", lambda: selective_scan(u, dl, A, B_, C_, torch.ones(E, device=device),
                                                torch.zeros(1, E, N, device=device), chunk=256))
    return out, spreads


def training(scale: str, device: str) -> dict:
    """The recall models this claim compares, for the report's training stage (training.py)."""
    return recall.tasks(RECALL_MODELS[scale], scale, device)


def measure(scale: str, device: str) -> dict:
    lens = [512, 1024, 2048] if scale == "quick" else [1024, 2048, 4096, 8192, 16384]
    rounds = max(1, recall.SETUPS[scale].seeds)  # one timing round per recall seed: a repetition is one of each
    timed = [_times(lens, device, 3 if scale == "quick" else 2, warmup=1 if r == 0 else 0) for r in range(rounds)]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    times = {k: [med([t[0][k][i] for t in timed]) for i in range(len(lens))] for k in timed[0][0]}
    recall.prefetch(RECALL_MODELS[scale], scale, device)  # done by the training stage, unless run alone
    return {"lengths": lens, "window": WINDOW, "times_s": times, "times_s_by_round": [t[0] for t in timed],
            "time_range_s_by_round": [t[1] for t in timed],
            "pairs_scored": {T: {"causal": T * (T + 1) // 2, "block_sparse": pairs_scored(T, default_block(T))}
                             for T in lens},
            "recall_setup": recall.setup_dict(scale),
            "recall": {name: recall.summary(name, scale, device) for name in RECALL_MODELS[scale]}}


def _one(lens, times: dict, acc: dict) -> Decision:
    """One repetition: exponents from one timing round, accuracies at the largest pair count from one seed."""
    exps = {k: fit_exponent(lens, v) for k, v in times.items()}
    reasons = ["time exponents: " + ", ".join(f"{k} {e:.2f}" if e is not None else f"{k} ?" for k, e in exps.items())]
    implausible = [k for k, e in exps.items() if not plausible_exponent(e, LOWEST[k], 3.0)]
    below = all(exps[k] is not None and exps["sdpa"] is not None and exps[k] < exps["sdpa"] for k in REMEDIES)
    exact = exps["sdpa"] is not None and exps["sdpa"] >= EXACT_MIN
    # each remedy near its predicted exponent: True within its bound, False at or past midway to 2, None between
    near = {k: None if exps[k] is None else True if exps[k] <= NEAR_BOUND[k] else False if exps[k] >= MIDWAY[k]
            else None for k in REMEDIES}
    faster = below and exact and all(v is not False for v in near.values())
    reasons.append(f"exact attention's exponent >= {EXACT_MIN}: {'yes' if exact else 'no'}; every remedy's below it: "
                   f"{'yes' if below else 'no'}; each near its predicted one (" + ", ".join(
                       f"{k} <= {NEAR_BOUND[k]:.2f}: {({True: 'yes', False: 'no'}).get(near[k], 'between')}"
                       for k in REMEDIES) + ")")
    if implausible:
        reasons.append("physically implausible fits (a measuring fault): " + ", ".join(implausible))
    diff = {f: acc["transformer"] - acc[f] for f in RECALL_DECIDED if f in acc}
    if "sliding" in acc:
        reasons.append(f"{SHOWN}: the sliding window's MQAR {acc['sliding']:.0%} (seed 0; its reach, "
                       "layers x window, holds few of the keys)")
    if "block_sparse" in acc:
        reasons.append(f"{SHOWN}: block_sparse's MQAR {acc['block_sparse']:.0%} (seed 0; an earlier "
                       "block reaches a query only through its one summary token)")
    wins = {f: True if d > RECALL_MARGIN else (False if d <= 0 else None) for f, d in diff.items()}
    if implausible:
        ok = None
    elif not faster or any(w is False for w in wins.values()):
        ok = False
    elif any(w is None for w in wins.values()):
        ok = None
        reasons.append(f"a recall difference is within {RECALL_MARGIN:.0%}: inconclusive")
    elif any(v is None for v in near.values()):
        ok = None
        reasons.append("a remedy's exponent lies between its bound and midway to 2: inconclusive")
    else:
        ok = True
    fmt = lambda e: "?" if e is None else f"{e:.2f}"
    reasons.append(f"sdpa {fmt(exps['sdpa'])} (>= {EXACT_MIN}?) vs " + ", ".join(
                       f"{k} {fmt(exps[k])} (<= {NEAR_BOUND[k]:.2f}?)" for k in REMEDIES)
                   + f"; MQAR exact {acc['transformer']:.0%} vs " + ", ".join(f"{f} {acc[f]:.0%}" for f in diff)
                   + "; beaten by more than the margin: " + (", ".join(f for f, w in wins.items() if w) or "none")
                   + ("; shown, not decided: " + ", ".join(f"{f} {acc[f]:.0%}" for f in RECALL_SHOWN if f in acc)
                      if any(f in acc for f in RECALL_SHOWN) else "")
                   + (f"; implausible fits (a measuring fault): {', '.join(implausible)}" if implausible else ""))
    return Decision(verdict(ok), reasons[-1], reasons)


def _seed(family: str, i: int) -> int:
    """The seed a repetition reads: its own for a decided family, seed 0 for the sliding window and block_sparse,
    which train one seed because their recall is only shown."""
    return 0 if family in RECALL_SHOWN else i


def _learned(rec: dict, family: str, at: int, i: int, need: float, why: str) -> dict:
    """The regime's condition on one family's accuracy at ``at`` pairs in seed i. A decided family has no seed i when
    its seed 0 missed this same bar (recall.Setup.seed_gates): not measured, so outside the regime."""
    runs = rec[family][at]
    name = f"{family}'s MQAR accuracy at {at} pairs (seed {i})"
    if i >= len(runs):
        if runs[0]["acc"] >= need:  # a seed 0 that passed trains the others: their absence is a fault
            raise ValueError(f"claim 8: {family} has no seed {i} although its seed 0 reached the bar "
                             f"({runs[0]['acc']:.0%} >= {need:.0%}); results incomplete, rerun the claim")
        return condition(name, None, f">= {need:.0%} ({why})", None,
                         f"not trained: seed 0 read {runs[0]['acc']:.0%}, below the bar")
    a = runs[i]["acc"]
    return condition(name, a, f">= {need:.0%} ({why})", a >= need, f"{a:.0%}")


def decide(m: dict) -> Decision:
    lens = m["lengths"]
    rounds = m.get("times_s_by_round") or [m["times_s"]]
    rec = {f: recall.by_int(r["test"]) for f, r in m["recall"].items()}
    top, smallest = max(rec["transformer"]), min(rec["transformer"])
    window = m.get("window", WINDOW)
    decisions = []
    seeds = m.get("recall_setup", {}).get("seeds") or max(len(r[top]) for r in rec.values())
    for i in range(seeds):
        acc = {f: r[top][_seed(f, i)]["acc"] for f, r in rec.items() if _seed(f, i) < len(r[top])}
        regime = [_learned(rec, "transformer", smallest, i, LEARNED, "the baseline learned recall")]
        regime += [_learned(rec, f, smallest, i, REMEDY_LEARNED, "it learned the task") for f in RECALL_DECIDED
                   if f in rec]
        regime.append(condition("shortest timed n / sliding window", lens[0] / window, f">= {MIN_N_PER_WINDOW}",
                                lens[0] / window >= MIN_N_PER_WINDOW, f"{lens[0]} / {window}"))
        if "transformer" in acc and all(f in acc for f in RECALL_DECIDED if f in rec):
            one = _one(lens, rounds[i % len(rounds)], acc)
        else:  # a family not trained on this seed: its seed 0 already put the claim outside its regime
            why = "a family was not trained on this seed (its seed 0 missed the bar)"
            one = Decision(verdict(None), why, [why])
        decisions.append(in_regime(regime, one))
    d = over_repeats(decisions)
    exps = {k: fit_exponent(lens, v) for k, v in m["times_s"].items()}
    fmt = lambda e: "?" if e is None else f"{e:.2f}"
    figure = (f"time exponents (median time over {len(rounds)} round(s)): " + ", ".join(
        f"{k} {fmt(exps[k])}" for k in ("sdpa",) + REMEDIES) + f" (window {window}); MQAR at {top} pairs: "
        + ", ".join(f"{f} {mean([s['acc'] for s in r[top]]):.0%}" for f, r in rec.items()))
    return Decision(d.verdict, figure, d.reasons, d.qualifier, d.regime, d.repeats)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    d = decide(m)
    lens, times, rec = m["lengths"], m["times_s"], m["recall"]
    setup = recall.SETUPS[scale]
    pairs = sorted(int(p) for p in rec["transformer"]["test"])
    curve = {f: [mean([s["acc"] for s in r["test"][p]]) for p in pairs] for f, r in rec.items()}
    rows = [{"method": k, "time_exponent": fit_exponent(lens, v), **{f"time_s_{T}": t for T, t in zip(lens, v)}}
            for k, v in times.items()]
    rows += [{"method": f, "params": r["params"], **{f"mqar_{p}_pairs": curve[f][i] for i, p in enumerate(pairs)}}
             for f, r in rec.items()]
    return Outcome.of(d, m, [
        Plot("Time vs n (4 heads x 64)", "n (tokens)", "seconds", [Series(k, lens, v) for k, v in times.items()],
             log_x=True, log_y=True),
        Plot("MQAR accuracy vs key-value pairs", "key-value pairs", "test accuracy",
             [Series(f, pairs, c) for f, c in curve.items()])], rows,
        ["Recall models are trained on MQAR with Zoology's recipe (recall.py: a learning-rate sweep per family, "
         f"parameters within 10% of the transformer's, {setup.seeds} seed(s) at the best rate of a sweep from "
         f"{setup.lrs} (" + "".join(f"{n}'s from {setup.lrs_of(n)}, " for n, _ in setup.family_lrs if n in rec)
         + "a best at an end extends it); "
         + "".join(f"{n} {setup.seeds_of(n)} seed(s), " for n in RECALL_SHOWN if n in rec)
         + "whose recall is shown, not decided; a decided family whose seed 0 misses the regime's bar at the smallest "
         "pair count trains no other seed, since that repetition alone leaves the claim outside its regime): sliding "
         f"has a window of {WINDOW} tokens, the window timed too; block_sparse uses blocks of sqrt(n) tokens in both "
         "(8 at the recall length of 64).",
         "Times: one round per recall seed, each the median of its calls after a warm-up; the table and plot show "
         "the median over rounds, the verdict decides each round with its seed."])
