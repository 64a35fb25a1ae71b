"""Claim 13: speculative decoding speeds up decoding without changing greedy output.

Where the claim lives: a target whose one-token decode step streams its weights from memory, so that checking
k+1 tokens in one pass costs about one step, and a draft much cheaper than that step that often agrees with it.
The target is trained on the embedded corpus (bf16 autocast where that is faster than fp32), drafts are distilled from its own
continuations sampled at TEMPERATURE (logits computed once); the draft and k are chosen on tuning prompts, and the
choice is timed on held-out prompts over several rounds, plain and speculative sampling alternating, each call on one
wall clock; greedy output is checked for identity apart, untimed. Timing sampled text, not greedy: a small model's
greedy text loops, and a draft predicts a loop for free, so a greedy speedup measures the loop as much as the draft.
Only a k whose verify pass over k+1 rows costs at most VERIFY_VS_STEP / CHOICE_MARGIN one-row steps (measured on a
tuning prompt) can be chosen: past VERIFY_VS_STEP the pass is no longer nearly free, the claim's premise, on this
hardware, and the margin keeps the chosen k inside that bound when it is measured again before each held-out round.
"""
import copy

import torch

from attnlab.config import ModelConfig
from attnlab.engine import generate
from attnlab.engine.generate import sample_continuations
from attnlab.engine.quantize import set_precision
from attnlab.engine.sampling import SamplingParams
from attnlab.engine.speculative import speculative_generate
from attnlab.experiments import speculative_models
from attnlab.experiments.speculative_models import GROW_STEPS, GROWN_STEPS
from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, Series, condition, in_regime, over_repeats,
                                      verdict)
from attnlab.models import build_model
from attnlab.timing import memory_bandwidth, now, time_calls

TITLE = "Speculative decoding"
CLAIM = "A small draft proposing k tokens that the target verifies in one parallel pass speeds up decoding, with identical greedy output."
PREDICTION = ("Greedy output is identical at every k; acceptance falls as k grows; the speedup over plain decoding of "
              "the same target exceeds 1 at some k when the draft is much cheaper than the target and often agrees.")
THRESHOLD = ("Per held-out round: supported if greedy output is identical (at every k tried) and the speedup of sampling "
             "at temperature 1 at the k and draft chosen on tuning prompts is >= 1.2; not supported if outputs differ "
             "or the speedup is < 1.0. The rounds must agree.")
THRESHOLD_GREEDY = ("Per held-out round: supported if greedy output is identical (at every k tried) and the speedup at the k and "
                    "draft chosen on tuning prompts is >= 1.2; not supported if outputs differ or the speedup is < 1.0. "
                    "The rounds must agree.")
STEP_VS_BANDWIDTH, VERIFY_VS_STEP, DRAFT_VS_STEP, AGREEMENT = 1.5, 1.5, 0.2, 0.6  # the REGIME's bounds
CHOICE_MARGIN = 1.15  # a k is chosen only where its tuning verify is this far inside VERIFY_VS_STEP (CHANGES)
LEARNED_LOSS = 2.0  # nats/byte on held-out text; a unigram model of the corpus scores about 3.1
REGIME_GREEDY = (f"A target whose decode is bound by memory bandwidth and a draft that is cheap and often agrees, each measured "
          f"in the same run: (1) the target's plain decode step takes <= {STEP_VS_BANDWIDTH}x its fp32 weight bytes / "
          f"the read bandwidth of a large sum; (2) its verify pass over k+1 rows takes <= {VERIFY_VS_STEP}x a one-row "
          f"step, at the chosen k; (3) a draft step takes <= {DRAFT_VS_STEP}x a target step; (4) the chosen draft "
          f"agrees with the target's greedy next token on >= {AGREEMENT:.0%} of positions (teacher-forced on the "
          "target's continuations of the tuning prompts); (5) the target has learned the corpus: held-out loss <= "
          f"{LEARNED_LOSS} nats/byte (a unigram model: about 3.1); (6) its greedy text on the held-out prompts is not "
          "a degenerate loop a draft copies for free: its share of distinct 4-grams >= 0.5x the real text's after "
          "the same prompts. At these bounds the expected speedup (Leviathan et al. "
          "2023, eq. 1, with acceptance = agreement) is about 1.0 at k = 2-3, so inside the regime the threshold "
          "of 1.2 can still be missed.")
REGIME_OLD = (f"A target whose decode is bound by memory bandwidth and a draft that is cheap and often agrees, each measured "
          f"in the same run: (1) the target's plain decode step takes <= {STEP_VS_BANDWIDTH}x its fp32 weight bytes / "
          f"the read bandwidth of a large sum; (2) its verify pass over k+1 rows takes <= {VERIFY_VS_STEP}x a one-row "
          f"step, at the chosen k; (3) a draft step takes <= {DRAFT_VS_STEP}x a target step; (4) the chosen draft "
          f"agrees with the target's greedy next token on >= {AGREEMENT:.0%} of positions (teacher-forced on the "
          "target's continuations of the tuning prompts); (5) the target has learned the corpus: held-out loss <= "
          f"{LEARNED_LOSS} nats/byte (a unigram model: about 3.1), so that its greedy text is not a degenerate loop a "
          "draft copies for free. At these bounds the expected speedup (Leviathan et al. "
          "2023, eq. 1, with acceptance = agreement) is about 1.0 at k = 2-3, so inside the regime the threshold "
          "of 1.2 can still be missed.")
TEMPERATURE = 1.0  # the timed decoding samples: a small model's greedy text loops (CHANGES 2026-12-05, second)
REGIME = (f"A target whose decode is bound by memory bandwidth and a draft that is cheap and often accepted, each "
          f"measured in the same run: (1) the target's plain decode step takes <= {STEP_VS_BANDWIDTH}x its fp32 weight "
          f"bytes / the read bandwidth of a large sum; (2) its verify pass over k+1 rows takes <= {VERIFY_VS_STEP}x a "
          f"one-row step, at the chosen k; (3) a draft step takes <= {DRAFT_VS_STEP}x a target step; (4) the chosen "
          f"draft's expected acceptance at temperature {TEMPERATURE:g}, the mean of sum_v min(p_v, q_v) over the "
          f"target's sampled continuations of the tuning prompts (teacher-forced), is >= {AGREEMENT:.0%}; (5) the "
          f"target has learned the corpus: held-out loss <= {LEARNED_LOSS} nats/byte (a unigram model: about 3.1); "
          "(6) the text the timed decoding draws (the target sampled on the held-out prompts) is not a degenerate loop "
          "a draft copies for free: its share of distinct 4-grams >= 0.5x the real text's after the same prompts. At "
          "these bounds the expected speedup (Leviathan et al. 2023, eq. 1) is about 1.0 at k = 2-3, so inside the "
          "regime the threshold of 1.2 can still be missed.")
CHANGES = [
    {"date": "2026-11-30", "what": "method: draft distilled from the target, verify-sized weight layout, held-out prompts",
     "old": ("target ~4.7M (dim 256, 6 layers) and draft ~0.05M each trained 1,500 steps on the corpus; one prompt; "
             "plain decoding timed at the one-row layout; k reported on the prompt it was measured on"),
     "new": ("target ~2.7M; draft ~0.07M distilled (KL to the target) on the target's greedy continuations of 256 "
             "training-split prompts; 3 validation-split prompts; the target's weights laid out for the k+1-row "
             "verify pass and plain decoding counted at the faster of its two layouts"),
     "why": ("the first full run (2026-11-29) was 'not supported' at 0.76x with the draft accepted 16% at k=1: a draft "
             "trained on the corpus predicts the corpus, not the target. This entry was missing: the method changed "
             "after that verdict without one. Verdict after: inconclusive (1.00x, 46% at k=1), then not supported "
             "(0.94x, 0.98x) in later reference runs.")},
    {"date": "2026-11-30", "what": "method: an untimed warm-up of each k's speculative and plain paths before timing",
     "why": ("Each k lays the target's weights out anew for k+1 rows; the first call on that layout paid one-time "
             "costs inside the timed prompts. The threshold is unchanged; the reasons now show the per-prompt spread.")},
    {"date": "2026-12-02",
     "what": "method and threshold: a measured regime, a target in it, tuning vs held-out prompts, rounds",
     "old": ("target ~2.7M (decode bound by per-step overhead, not bandwidth); best of k in (1, 2, 4, 6) on the 3 "
             "prompts it is reported on; one timing; threshold on that best speedup"),
     "new": ("REGIME measured in the run (step vs weight bytes / bandwidth, verify rows vs one row, draft vs target step, "
             "draft agreement, the target's held-out loss); full: a ~57M target (dim 768, 8 layers) trained with "
             "bf16 autocast at 256 tokens (the old target ran past its trained length of 96), two drafts "
             "distilled from precomputed target logits, draft and k chosen on tuning prompts, the choice timed on "
             "held-out prompts in 3 rounds of alternating order, one wall clock; the threshold applied per round, "
             "the verdict through over_repeats"),
     "why": ("issue 29: at ~2.7M parameters a decode step is Python overhead, not weight traffic, so verifying k+1 "
             "tokens is not nearly free and the draft's overhead is a large share of the target's: the set-up could "
             "not show the claim (Leviathan et al. 2023 report 2-3x where a step is memory-bound). Verdict before: "
             "not supported (0.98x at k=1, 46% accepted). Verdict after, quick: inconclusive (regime not reached: "
             "a 1.8M target trained 30 steps, loss 2.89 nats/byte, decode step 14-22x its weights over bandwidth on "
             "a host running ~10 processes on 2 cores). Full scale was not run to the end when this entry was "
             "written (that host trained the target at ~10 s a step); its first full run gives the verdict after.")},
    {"date": "2026-12-03",
     "what": "method: k chosen only where verifying is nearly free; the target trained in fp32 where bf16 is slower",
     "old": ("k chosen among (2, 3, 4, 6) by tuning speedup alone; the target trained 300 steps under bf16 autocast; "
             "256 sampled continuations, drafts distilled 400 steps"),
     "new": ("k chosen among those whose verify pass over k+1 rows took <= VERIFY_VS_STEP one-row steps on a tuning "
             "prompt (regime condition (2), then measured again on a held-out prompt); the target trained 340 steps, "
             "in fp32 unless bf16 autocast is faster here (runtime.bf16_trains_faster: a GPU, or a CPU with AMX); "
             "192 continuations, drafts distilled 300 steps. REGIME bounds and THRESHOLD unchanged"),
     "why": ("The first full run in the measured regime (2026-12-03, reference 2ef4f65) chose k=6, whose 7-row verify "
             "took 1.78 one-row steps: the chosen k itself put condition (2) out of reach, where k=3 (speedup 2.15x on "
             "tuning) would have kept it; a practitioner picks k where verification is nearly free, and the claim is "
             "about that case. The target's held-out loss was 2.016 against <= 2.0 after 300 steps: more steps, not a "
             "looser bound. Training took 2,085 s of the run's 2,496: on an AVX-512 CPU without AMX a step of the "
             "57M target took 6.2-6.6 s under bf16 autocast and 3.6 s in fp32 (a (2048, 768) x (768, 3072) product: "
             "156 GFLOP/s in bf16, 235 in fp32). Verdict before: inconclusive (regime not reached: step 1.56-1.68x "
             "weights over bandwidth, verify 1.78, loss 2.016; the data alone read supported, 2.90-3.06x held out). "
             "Verdict after (full run of 444a906, `attnlab report --scale full --only 13`, 1,768 s): inconclusive "
             "(regime not reached): loss 1.958 and k=4 chosen (its verify 1.40 one-row steps on the tuning prompt), "
             "but on the held-out prompt the same verify took 1.515, and round 3's step was 1.52x weights over "
             "bandwidth; the data alone read supported, 2.28-2.58x. Training took 1,425 s of the 1,768.")},
    {"date": "2026-12-03",
     "what": "method: the target grown from a trained narrow model; each round's conditions measured just before it",
     "old": ("the 57M target trained from scratch (340 steps, 1,425 s); the regime's step ratios measured once per "
             "run as ratios of separately taken medians, and the decode step compared with the best bandwidth of two "
             "measurements at the run's start and end"),
     "new": ("a model of a third the width (dim 256, 4 heads, 8 layers, 6.3M) trained GROW_STEPS steps at NARROW_LR, "
             "grown 3x wider into the same 57M target (models/grow.py, Net2WiderNet, Chen et al. 2016: the same "
             "function, copies perturbed by GROW_NOISE of each matrix's spread) and trained GROWN_STEPS more at "
             "GROWN_LR; before every held-out round: the bandwidth, and the verify and draft step ratios as medians "
             "of 15 alternating pairs of calls on one clock; a round's decode step is compared with the bandwidth "
             "measured before it. REGIME bounds and THRESHOLD unchanged. A probe of these settings (training only): the narrow "
             "model reached 1.695 nats/byte held out in 400 steps (277 s), grown 1.695, after 40 more steps 1.691 "
             "(4.4 s a step)"),
     "why": ("The full report must fit in an hour on 2 cores, and training a 57M model from scratch to the learned "
             "bound took 24 min of it: the claim needs a learned model with a 57M model's weight traffic per token, "
             "which a narrow model grown wide gives at a fraction of the cost. The conditions: on this shared host "
             "the bandwidth of a large sum read 14.8-26.2 GB/s minutes apart, and the verify ratio of the same k "
             "read 1.40 and 1.515 on two measurements, so a step compared with a bandwidth or a one-row step taken "
             "at another time measured the host's drift as much as the target. Verdict before: inconclusive (regime "
             "not reached, above). Verdict after: the next full run.")},
    {"date": "2026-12-03", "what": "method: the target trained in the report's training stage, on one thread",
     "old": "the narrow model and the grown target trained inside the claim, on the report's threads (2 here)",
     "new": ("the same training as one job of the report's training stage (experiments/training.py): a worker process "
             "of one thread, beside the other claims' models, before any claim is timed; drafts, tuning and the "
             "held-out rounds unchanged, in the claim"),
     "why": ("Issue 29: the full report must fit in an hour on 2 cores, and the claims' training left a core idle "
             "whenever one claim's last run or a two-thread run of a small model (which gains 1.0-1.9x from the second "
             "thread) held the machine. The same recipe on one thread sums in another order, so the target differs in "
             "its last bits. Verdict before: supported (reference 51ff1f2); after: the next full run.")},
    {"date": "2026-12-04", "what": "method: k chosen with a margin inside the verify bound",
     "old": "k chosen among those whose tuning verify pass took <= VERIFY_VS_STEP (1.5) one-row steps",
     "new": ("k chosen among those whose tuning verify pass took <= VERIFY_VS_STEP / CHOICE_MARGIN (1.5 / 1.15 = 1.30) "
             "one-row steps; REGIME bounds and THRESHOLD unchanged"),
     "why": ("Choosing the fastest k under the same bound that the regime checks again afterwards puts the chosen k "
             "at the bound by construction: the reference at c6f02a9 chose k=6 at a tuning verify of 1.498, which "
             "read 1.512, 1.513 and 1.551 before the three held-out rounds (regime not reached in each), while k=4 "
             "(1.296 on tuning, speedup 2.71x) sat well inside. The margin covers the 1-4% the same verify moved "
             "between measurements several times over. Verdict before: inconclusive (regime not reached in all 3 "
             "rounds; the data alone read supported, 2.77-2.92x held out). Verdict after: reports/HISTORY.md, the "
             "reference run at the commit that made this change.")},
]
CHANGES.append(
    {"date": "2026-12-05", "what": "regime: the target's greedy text measured for loops (condition 6)",
     "old": REGIME_OLD, "new": REGIME_GREEDY,
     "why": ("Issue 29's independent read: condition (5) measures a teacher-forced loss, which does not see the "
             "greedy text the draft is asked to predict; a 0.5M-parameter draft agreeing on most positions is what a "
             "repetitive continuation would give. Now the greedy continuations on the held-out prompts must keep at "
             "least half the real text's share of distinct 4-grams. Prediction and threshold unchanged. Verdict "
             "before: supported (679adec, 3 of 3 rounds); after, on the same data: inconclusive (regime not "
             "reached: the greedy text's 4-grams were not recorded).")})
CHANGES.append(
    {"date": "2026-12-05", "what": "method and regime: speedup timed on sampled text; acceptance as Leviathan's alpha",
     "old": f"THRESHOLD: {THRESHOLD_GREEDY} REGIME: {REGIME_GREEDY}",
     "new": (f"THRESHOLD: {THRESHOLD} REGIME: {REGIME} Drafts distilled on the target's sampled continuations; greedy "
             "identity checked untimed at every tuning setting and in every held-out round. Bounds and threshold "
             "values unchanged."),
     "why": ("The reference at a41083d (bbc92d7) met every condition but (6): the 57M target's greedy text kept 0.16 of "
             "its 4-grams distinct against the real text's 0.54 (ratio 0.29), at a held-out loss of 1.70 nats/byte. A "
             "byte-level model this small loops under greedy decoding, and training it until it stops looping does not "
             "fit the report's hour. Sampled at temperature 1 its text follows its own distribution and does not loop, "
             "and speculative sampling must then match distributions, not a loop: the regime the claim is about, "
             "measured. Verdict before: inconclusive (regime not reached; the data alone read supported, 2.78-2.86x "
             "held out at k = 4, greedy). Verdict after: reports/HISTORY.md, the reference run at the commit that "
             "made this change.")})
EST_S = {"quick": 5, "full": 320}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 5, "full": 350}  # this claim's share of the training stage (training.py), in seconds

GOOD, BREAK_EVEN = 1.2, 1.0  # the THRESHOLD above, as numbers
NOT_LOOPING = 0.5  # the REGIME's condition (6): at least half the real text's share of distinct 4-grams
SETUPS = {
    "quick": dict(target=ModelConfig(dim=192, n_layers=4, n_heads=6, max_seq_len=256), grow=3, steps=30, grown_steps=5,
                  samples=32,
                  drafts={"d64x1": ModelConfig(dim=64, n_layers=1, n_heads=2, max_seq_len=256)}, draft_steps=40,
                  ks=(2, 4), prompt_len=64, sample_new=48, new=32, tuning=1, held_out=2, rounds=2, seq_len=128,
                  batch=16),
    "full": dict(target=ModelConfig(dim=768, n_layers=8, n_heads=12, max_seq_len=512), grow=3, steps=GROW_STEPS,
                 grown_steps=GROWN_STEPS, samples=192,
                 drafts={"d128x1": ModelConfig(dim=128, n_layers=1, n_heads=2, max_seq_len=512),
                         "d192x2": ModelConfig(dim=192, n_layers=2, n_heads=3, max_seq_len=512)}, draft_steps=300,
                 ks=(2, 3, 4, 6), prompt_len=128, sample_new=128, new=128, tuning=3, held_out=4, rounds=FULL_REPEATS,
                 seq_len=256, batch=8),  # trained as long as a prompt and its continuation: RoPE past it is untrained
}


def training(scale: str, device: str) -> dict:
    """The target, for the report's training stage (training.py)."""
    return speculative_models.target_tasks(SETUPS[scale], scale, device)


def _step_s(model, prompt: list[int], rows: int, n: int = 15) -> float:
    """Median wall time of one forward of `rows` new tokens after the prompt (the cache rolled back each time)."""
    device = next(model.parameters()).device
    state = model.new_state(1, len(prompt) + rows + 1)
    with torch.inference_mode():
        model(torch.tensor([prompt], device=device), state)
        ids = torch.tensor([prompt[-rows:]], device=device)
        return time_calls(lambda: model(ids, state), n, 1, device=device,
                          before=lambda: state.rollback([len(prompt)]))["median_s"]


def _paired_ratio(num, num_rows: int, den, den_rows: int, prompt: list[int], n: int = 15) -> float:
    """Median over n alternating pairs of calls of (``num``'s forward of ``num_rows`` new tokens) / (``den``'s of
    ``den_rows``), each after the prompt with its cache rolled back: a ratio of two paths on one clock, where a
    ratio of two medians taken apart would also measure how the machine's pace moved between them."""
    device = next(num.parameters()).device
    sides = []
    with torch.inference_mode():
        for model, rows in ((num, num_rows), (den, den_rows)):
            state = model.new_state(1, len(prompt) + rows + 1)
            model(torch.tensor([prompt], device=device), state)
            ids = torch.tensor([prompt[-rows:]], device=device)
            model(ids, state)  # warm-up
            state.rollback([len(prompt)])
            sides.append((model, ids, state))

        def once(model, ids, state) -> float:
            t = now(device)
            model(ids, state)
            took = now(device) - t
            state.rollback([len(prompt)])
            return took

        ratios = []
        for i in range(n):  # the order alternates
            if i % 2 == 0:
                a = once(*sides[0])
                b = once(*sides[1])
            else:
                b = once(*sides[1])
                a = once(*sides[0])
            ratios.append(a / b)
    return sorted(ratios)[n // 2]


class _Phases:
    """Wall seconds per phase of the experiment, for its time budget (EST_S)."""

    def __init__(self):
        self.spent, self.t = {}, now()

    def __call__(self, name: str) -> None:
        t = now()
        self.spent[name], self.t = t - self.t, t


def _timed(fn):
    t = now()
    out = fn()
    return now() - t, out


def _sampling(i: int) -> SamplingParams:
    """The timed decoding's settings for prompt ``i``: sampling at TEMPERATURE with a seed of its own."""
    return SamplingParams(temperature=TEMPERATURE, seed=i)


def _identical(target_k, draft, k: int, prompts, base, new) -> bool:
    """Untimed: greedy speculative decoding gives the greedy tokens ``base`` on every prompt."""
    return all(speculative_generate(target_k, p, new, k=k, draft=draft).tokens == b for p, b in zip(prompts, base))


def _tune(plain, layouts, drafts, prompts, base, new) -> list[dict]:
    """Every (draft, k) on the tuning prompts: speedup (sampled) over the faster plain layout, acceptance, identity
    (greedy)."""
    plain_s = sum(min(_timed(lambda: generate(m, p, new, _sampling(i)))[0] for m in (plain, *layouts.values()))
                  for i, p in enumerate(prompts))
    rows = []
    for name, draft in drafts.items():
        for k, target_k in layouts.items():
            speculative_generate(target_k, prompts[0], 8, k=k, draft=draft, params=_sampling(0))  # warm-up, untimed
            spent, acc, prop = 0.0, 0, 0
            for i, p in enumerate(prompts):
                dt, out = _timed(lambda: speculative_generate(target_k, p, new, k=k, draft=draft, params=_sampling(i)))
                spent += dt
                acc += round(out.stats.accepted * out.stats.proposed)
                prop += out.stats.proposed
            rows.append({"draft": name, "k": k, "speedup": plain_s / spent, "acceptance": acc / max(1, prop),
                         "proposed": prop, "identical": _identical(target_k, draft, k, prompts, base, new)})
    return rows


def _held_out_round(r, plain, target_k, draft, k, prompts, base, new) -> dict:
    """One round on the held-out prompts: plain (both layouts) and speculative, sampled, the order reversed on every
    other prompt and round, each call on the same wall clock; then greedy identity, untimed."""
    paths = [lambda p, sp: generate(plain, p, new, sp), lambda p, sp: generate(target_k, p, new, sp),
             lambda p, sp: speculative_generate(target_k, p, new, k=k, draft=draft, params=sp)]
    spent, tpot = [0.0] * 3, [[], []]
    acc = prop = 0
    for i, p in enumerate(prompts):
        order = [0, 1, 2] if (r + i) % 2 == 0 else [2, 1, 0]
        for j in order:
            dt, out = _timed(lambda: paths[j](p, _sampling(i)))
            spent[j] += dt
            if j < 2:
                tpot[j].append(out.stats.tpot_s)
            else:
                acc += round(out.stats.accepted * out.stats.proposed)
                prop += out.stats.proposed
    best = 0 if spent[0] <= spent[1] else 1
    return {"round": r + 1, "plain_s": spent[best], "plain_layout_rows": [1, k + 1][best], "speculative_s": spent[2],
            "speedup": spent[best] / spent[2], "acceptance": acc / max(1, prop),
            "identical": _identical(target_k, draft, k, prompts, base, new),
            "step_s": sorted(tpot[best])[len(tpot[best]) // 2]}


def measure(scale: str, device: str) -> dict:
    s = SETUPS[scale]
    clock = _Phases()
    t = speculative_models.target(s, scale, device)
    clock("target (the training stage's, unless run alone)")
    clock.spent.update(t["phase_s"])  # the target's training, in the stage or just now
    trained, task, tc, amp, val_loss = t["model"], t["task"], t["train_config"], t["amp"], t["val_loss"]
    n_target = sum(p.numel() for p in trained.parameters())
    plen, new = s["prompt_len"], s["new"]
    plain = set_precision(copy.deepcopy(trained), "fp32")
    samples = torch.tensor(sample_continuations(plain, task.train_ids, s["samples"], plen, s["sample_new"], seed=1,
                                                params=_sampling(1)), device=device)
    clock("samples")
    drafts = speculative_models.train_drafts(s, tc, samples, speculative_models.teacher_logits(trained, samples, amp),
                                             device)
    clock("distil drafts")
    n_drafts = {name: sum(p.numel() for p in d.parameters()) for name, d in drafts.items()}
    # tuning and held-out prompts: disjoint windows of the validation split, alternating
    starts = [1000 + 3000 * i for i in range(s["tuning"] + s["held_out"])]
    tuning = [task.val_ids[a:a + plen].tolist() for a in starts[:s["tuning"]]]
    held = [task.val_ids[a:a + plen].tolist() for a in starts[s["tuning"]:]]
    bandwidth = [memory_bandwidth(device=device)]
    base_tuning = [generate(plain, p, new).tokens for p in tuning]
    base_held = [generate(plain, p, new).tokens for p in held]
    sampled_tuning = [generate(plain, p, new, _sampling(i)).tokens for i, p in enumerate(tuning)]
    sampled_held = [generate(plain, p, new, _sampling(i)).tokens for i, p in enumerate(held)]
    # the verify pass has k+1 rows: the target's weights are laid out for that size (quantize.DenseLinear)
    layouts = {k: set_precision(copy.deepcopy(trained), "fp32", rows=k + 1) for k in s["ks"]}
    for m in (plain, *layouts.values()):
        generate(m, tuning[0], 8)  # warm-up of each layout, untimed
    clock("layouts")
    agreement = {name: speculative_models.expected_acceptance(plain, d, [p + c for p, c in zip(tuning, sampled_tuning)],
                                                              plen, TEMPERATURE) for name, d in drafts.items()}
    tuned = _tune(plain, layouts, drafts, tuning, base_tuning, new)
    tune_ctx = tuning[0] + base_tuning[0]
    one_row = min((plain, *layouts.values()), key=lambda m: _step_s(m, tune_ctx, 1))  # the faster one-row layout
    verify_ratio = {k: _paired_ratio(m, k + 1, one_row, 1, tune_ctx) for k, m in layouts.items()}
    for r in tuned:
        r["verify_vs_step"] = verify_ratio[r["k"]]
    chosen = max(eligible_settings(tuned), key=lambda r: r["speedup"])
    clock("tuning")
    k, draft = chosen["k"], drafts[chosen["draft"]]
    ctx = held[0] + base_held[0]
    real = [task.val_ids[a + plen:a + plen + new].tolist() for a in starts[s["tuning"]:]]  # the text that follows
    regime = {"weight_bytes": 4 * n_target, "agreement": agreement[chosen["draft"]],
              "distinct_4grams": {"sampled": distinct_ngrams(sampled_held), "greedy": distinct_ngrams(base_held),
                                 "text": distinct_ngrams(real)}}
    clock("regime steps")
    rounds = []
    for r in range(s["rounds"]):  # each round's conditions measured just before it, on the machine it meets
        here = {"bandwidth_bytes_per_s": memory_bandwidth(device=device),
                "verify_vs_step": _paired_ratio(layouts[k], k + 1, one_row, 1, ctx),
                "draft_vs_step": _paired_ratio(draft, 1, one_row, 1, ctx)}
        rounds.append({**_held_out_round(r, plain, layouts[k], draft, k, held, base_held, new), **here})
    bandwidth.append(memory_bandwidth(device=device))
    clock("held-out rounds")
    grown_from = {"factor": s["grow"], "steps": s["steps"], "val_loss": t["narrow_loss"], "grown_steps": s["grown_steps"],
                  "params": sum(p.numel() for p in build_model(speculative_models.narrow_config(s), "meta").parameters())}
    return {"target_params": n_target, "target_val_loss": val_loss, "bf16_autocast": amp, "grown_from": grown_from,
            "draft_params": n_drafts, "steps": s["steps"],
            "draft_steps": s["draft_steps"], "samples": len(samples), "new_tokens": new, "prompt_len": plen,
            "tuning_prompts": len(tuning), "held_out_prompts": len(held), "agreement_by_draft": agreement,
            "tuning": tuned, "chosen": {"draft": chosen["draft"], "k": k}, "bandwidth_bytes_per_s": bandwidth,
            "temperature": TEMPERATURE,
            **regime, "rounds": rounds, "phase_s": clock.spent}


def distinct_ngrams(texts: list[list[int]], n: int = 4) -> float:
    """The share of distinct n-grams among all the n-grams of ``texts`` (token ids): near 1 for varied text, low for
    a continuation that loops on itself."""
    grams = [tuple(t[i:i + n]) for t in texts for i in range(len(t) - n + 1)]
    return len(set(grams)) / max(1, len(grams))


def eligible_settings(tuned: list[dict]) -> list[dict]:
    """The tuning rows a k may be chosen from: greedy output identical and the verify pass within VERIFY_VS_STEP /
    CHOICE_MARGIN one-row steps; failing that, the identical ones (condition (2) then reads not met); failing that,
    all."""
    same = [r for r in tuned if r["identical"]]
    cheap = [r for r in same if r.get("verify_vs_step", float("inf")) <= VERIFY_VS_STEP / CHOICE_MARGIN]
    return cheap or same or tuned


def conditions(measured: dict, rnd: dict) -> list[dict]:
    """The REGIME's six conditions for one held-out round, from what was measured just before it (runs before
    that measured them once per run, and took the best bandwidth of the run)."""
    bandwidth = rnd.get("bandwidth_bytes_per_s") or max(measured["bandwidth_bytes_per_s"])
    ideal = measured["weight_bytes"] / bandwidth
    step, k = rnd["step_s"] / ideal, measured["chosen"]["k"]
    verify = rnd.get("verify_vs_step") or measured["verify_step_s"] / measured["target_step_s"]
    draft = rnd.get("draft_vs_step") or measured["draft_step_s"] / measured["target_step_s"]
    agree = measured["agreement"]
    return [
        condition("decode step / (weight bytes / bandwidth)", step, f"<= {STEP_VS_BANDWIDTH}", step <= STEP_VS_BANDWIDTH,
                  f"{step:.2f} ({1e3 * rnd['step_s']:.2f} ms vs {1e3 * ideal:.2f} ms for "
                  f"{measured['weight_bytes'] / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s)"),
        condition(f"verify of k+1={k + 1} rows / one-row step", verify, f"<= {VERIFY_VS_STEP}", verify <= VERIFY_VS_STEP),
        condition("draft step / target step", draft, f"<= {DRAFT_VS_STEP}", draft <= DRAFT_VS_STEP),
        condition(_agreement_name(measured), agree, f">= {AGREEMENT:.0%}", agree >= AGREEMENT, f"{agree:.0%}"),
        condition("target held-out loss (nats/byte)", measured["target_val_loss"], f"<= {LEARNED_LOSS}",
                  measured["target_val_loss"] <= LEARNED_LOSS),
        _not_looping(measured.get("distinct_4grams")),
    ]


def _agreement_name(measured: dict) -> str:
    t = measured.get("temperature")
    if t is None:  # runs before sampled timing: the greedy next token
        return "draft agreement (teacher-forced, tuning)"
    return f"draft's expected acceptance at temperature {t:g} (teacher-forced, tuning)"


def _not_looping(d: dict | None) -> dict:
    """The REGIME's sixth condition: the target's continuations on the held-out prompts, as the timed decoding draws
    them (sampled; greedy in runs before that), repeat themselves no more than twice as much as the real text after
    those prompts (distinct 4-grams), so a draft's agreement is with text, not with a loop that any draft predicts."""
    kind = "sampled" if d and "sampled" in d else "greedy"
    name = f"target's {kind} text: distinct 4-grams / the real text's"
    if not d:
        return condition(name, None, f">= {NOT_LOOPING} (not a loop)", None, "not recorded")
    share = d[kind] / max(d["text"], 1e-12)
    return condition(name, share, f">= {NOT_LOOPING} (not a loop)", share >= NOT_LOOPING,
                     f"{d[kind]:.2f} / {d['text']:.2f}")


def acceptance_by_k(tuning: list[dict]) -> str:
    """The PREDICTION's "acceptance falls as k grows", shown on the tuning prompts (drafts pooled), not decided: the
    share of a round's k proposals accepted is the mean over j <= k of P(the first j are accepted), which cannot rise
    with k, so the data could only disagree by noise (CHANGES 2026-12-03)."""
    ks = sorted({r["k"] for r in tuning})
    if any("proposed" not in r for r in tuning):
        return "acceptance vs k (shown, not decided): proposal counts not recorded"
    pooled = []
    for k in ks:
        rows = [r for r in tuning if r["k"] == k]
        n = sum(r["proposed"] for r in rows)
        pooled.append(f"k={k} {sum(r['acceptance'] * r['proposed'] for r in rows) / max(1, n):.1%} of {n}")
    return "acceptance vs k on the tuning prompts (shown, not decided: it cannot rise with k): " + ", ".join(pooled)


def decide_round(measured: dict, rnd: dict) -> Decision:
    """One held-out round against the THRESHOLD (greedy identity also over every tuning setting)."""
    tuning_same = all(r["identical"] for r in measured["tuning"])
    same, s = tuning_same and rnd["identical"], rnd["speedup"]
    ok = None if same and BREAK_EVEN <= s < GOOD else (same and s >= GOOD)
    c = measured["chosen"]
    reason = (f"round {rnd['round']}: greedy output identical {'yes' if same else 'no'}; speedup {s:.2f}x at "
              f"k={c['k']} with draft {c['draft']} (accepted {rnd['acceptance']:.0%}) >= {GOOD}: "
              f"{'yes' if s >= GOOD else 'no'}; >= {BREAK_EVEN}: {'yes' if s >= BREAK_EVEN else 'no'}")
    return Decision(verdict(ok), f"speedup {s:.2f}x", [reason])


def decide(measured: dict) -> Decision:
    rounds = measured["rounds"]
    c = measured["chosen"]
    speedups = [r["speedup"] for r in rounds]
    same = all(r["identical"] for r in rounds) and all(r["identical"] for r in measured["tuning"])
    figure = (f"held-out speedup {min(speedups):.2f}-{max(speedups):.2f}x over {len(rounds)} rounds at k={c['k']} "
              f"(draft {c['draft']}, accepted {sum(r['acceptance'] for r in rounds) / len(rounds):.0%}); "
              f"greedy output identical: {same}")
    d = over_repeats([in_regime(conditions(measured, r), decide_round(measured, r)) for r in rounds], figure)
    d.reasons.append(acceptance_by_k(measured["tuning"]))
    return d


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    plots = []
    for name in m["draft_params"]:
        rows = [r for r in m["tuning"] if r["draft"] == name]
        ks = [r["k"] for r in rows]
        plots.append(Plot(f"Tuning prompts, draft {name}: speedup and acceptance vs k", "k (draft tokens per round)",
                          "x plain decode / accepted share",
                          [Series("speedup", ks, [r["speedup"] for r in rows]),
                           Series("acceptance", ks, [r["acceptance"] for r in rows])]))
    table = [{"set": "tuning", **r} for r in m["tuning"]] + [{"set": "held-out", **r} for r in m["rounds"]]
    drafts = ", ".join(f"{n} {p / 1e6:.2f}M" for n, p in m["draft_params"].items())
    g = m.get("grown_from")
    grown = (f"a {g['params'] / 1e6:.1f}M model trained {g['steps']} steps (held-out loss {g['val_loss']:.2f}), grown "
             f"{g['factor']}x wider (Net2WiderNet) and trained {g['grown_steps']} more steps; " if g and g["factor"] > 1
             else f"trained {m['steps']} steps; ")
    precision = "bf16 autocast" if m.get("bf16_autocast", True) else "fp32"
    return Outcome.of(decide(m), m, plots, table, [
        f"Target {m['target_params'] / 1e6:.1f}M parameters ({grown}{precision}) on the embedded corpus, held-out "
        f"loss {m['target_val_loss']:.2f} nats/byte; drafts ({drafts}) distilled {m['draft_steps']} steps on the target's "
        f"{'sampled' if m.get('temperature') else 'greedy'} continuations of {m['samples']} training-split prompts.",
        f"Draft and k chosen on {m['tuning_prompts']} tuning prompts, reported on {m['held_out_prompts']} held-out "
        f"prompts of {m['prompt_len']} tokens, {m['new_tokens']} new tokens each; plain decoding counts at the faster of "
        "its two weight layouts. fp32 weights: greedy identity is exact only in fp32 (engine/speculative.py).",
        "That sampled tokens follow the target's distribution is tested by a chi-square test in "
        "tests/test_speculative.py, not here.",
        "Timings on a shared 2-core CPU are noisy; the rounds show the spread."])
