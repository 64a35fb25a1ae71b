"""Claim 17: attention and a linear recurrence split across devices; a nonlinear recurrence does not.

Three computations over one sequence, on 1, 2 and 4 processes (one thread, or one GPU, each): ring attention
(distributed/ring.py; 1 and 2 only), the SSM's linear recurrence by a scan split across processes
(distributed/scan.py: chunk scans, an exchange of (decay, end) summaries, a correction), and an LSTM, whose only
exact split is a relay of its state from rank to rank. Each round launches fresh processes per count (the order
reversed every other round) and is decided alone; the rounds must agree (``over_repeats``).
"""
import os

import torch

from attnlab.experiments import split_probe
from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, Series, condition, in_regime, mean,
                                      over_repeats, SHOWN, verdict)

TITLE = "Attention splits across devices, a nonlinear recurrence does not"
CLAIM = ("Attention's work over a sequence can be spread across processes (each keeps its queries and sees the "
         "others' keys and values in turn: ring attention), so the time and the memory per process fall as "
         "processes are added. So can a linear recurrence such as an SSM's (h_t = a_t h_{t-1} + b_t): a chunk's "
         "effect on the state is summed up by two small tensors, so every process scans its chunk at once and "
         "corrects it with the state the others hand over. A nonlinear recurrence (an LSTM) has no such summary: "
         "its time steps form one chain, so splitting its sequence moves the work without shortening the chain.")
PREDICTION = ("At a fixed total length (one thread or one GPU per process): from 1 to 2 processes ring attention's "
              "forward + backward time falls to <= 0.75x and its peak memory per process to <= 0.8x; from 1 to 4 "
              "processes the SSM's scan split across them (each scans its chunk, then corrects it with the state "
              "handed over: about 2T/P steps of scan) takes <= 0.75x, while the LSTM split across 2 or 4 processes "
              "(each waits for the previous one's final state) takes >= 0.9x. (At 2 processes the split scan gains "
              "little: its correction costs up to one more scan; shown, not decided.)")
ATTN_TIME, ATTN_MEM, SSM_TIME, LSTM_TIME, NO_SPLIT, NO_MEM = 0.75, 0.8, 0.75, 0.9, 0.9, 0.9
THRESHOLD = ("Each part's time is its critical path: on CPUs the compute thread's CPU time (what it takes when each "
             "process has a core of its own; waits for peers and turns given to other processes excluded, wall time "
             "recorded beside it): attention the slowest process, the SSM the slowest process's scan plus the "
             "slowest correction, the LSTM the sum over the chain of processes; on GPUs the same with synchronised "
             "wall time. Each round times every part several times per process count; a ratio (P processes / 1) "
             "counts only when its whole range is past a threshold. Attention's P / 1 is across launches (its "
             "range: fastest over slowest to slowest over fastest); the SSM's and the LSTM's are paired within one "
             "launch (each call's split run beside the whole sequence run alone on rank 0, in alternating order), "
             "their range over the calls' ratios. A "
             f"round is supported if attention's time ratio at 2 is <= {ATTN_TIME}, its memory ratio <= {ATTN_MEM} "
             f"and the SSM's time ratio at 4 <= {SSM_TIME}; not supported if attention's ratio at 2 or the SSM's at 4 "
             f"is >= {NO_SPLIT} (it did not split) or attention's memory ratio >= {NO_MEM}; otherwise inconclusive. "
             "The LSTM's ratios (the relay: rank p starts when p-1 hands over its state) are shown, not decided: the "
             "relay cannot split by construction, and no parallel method for a nonlinear recurrence is built. "
             f"The verdict is the rounds' common verdict ({FULL_REPEATS} rounds at full scale); rounds that disagree "
             "make it inconclusive (unstable).")
REGIME = ("Devices that compute apart: >= 2 CPU cores (or >= 2 GPUs with --device cuda; 4 processes need 4 GPUs); "
          "a sequence long enough that the split work dominates: each decided part's (attention's, the SSM's) "
          "one-process time >= 0.05 s, and one exchange of a key/value block between 2 processes <= 0.25x attention's "
          "per-process time. Where 4 processes share fewer CPU cores, each one's compute-thread CPU time stands for a "
          "core of its own (the split's critical path on 4 cores), and that stand-in is checked: a rank's scan of its "
          "quarter of the sequence takes 0.8-1.5x a quarter of the whole scan run alone on rank 0 in the same launch "
          "(the median over the calls' pairs: sharing the cores neither adds nor hides work); the 4-process wall time "
          "on the cores at hand is shown beside it.")
# Wordings CHANGES quotes as they read before a change: the SSM's ratio across launches, and its stand-in check.
_THRESHOLD_SSM_ACROSS_LAUNCHES = ("Each part's time is its critical path: on CPUs the compute thread's CPU time (what it takes when each "
             "process has a core of its own; waits for peers and turns given to other processes excluded, wall time "
             "recorded beside it): attention the slowest process, the SSM the slowest process's scan plus the "
             "slowest correction, the LSTM the sum over the chain of processes; on GPUs the same with synchronised "
             "wall time. Each round times every part several times per process count; a ratio (P processes / 1) "
             "counts only when its whole range (fastest over slowest to slowest over fastest) is past a threshold; "
             "the LSTM's P / 1 is paired within one launch (each call's chain over the whole sequence run alone on "
             "rank 0 beside it), its range over the calls' ratios. A "
             f"round is supported if attention's time ratio at 2 is <= {ATTN_TIME}, its memory ratio <= {ATTN_MEM} "
             f"and the SSM's time ratio at 4 <= {SSM_TIME}; not supported if attention's ratio at 2 or the SSM's at 4 "
             f"is >= {NO_SPLIT} (it did not split) or attention's memory ratio >= {NO_MEM}; otherwise inconclusive. "
             "The LSTM's ratios (the relay: rank p starts when p-1 hands over its state) are shown, not decided: the "
             "relay cannot split by construction, and no parallel method for a nonlinear recurrence is built. "
             f"The verdict is the rounds' common verdict ({FULL_REPEATS} rounds at full scale); rounds that disagree "
             "make it inconclusive (unstable).")
_REGIME_STAND_IN_ACROSS_LAUNCHES = ("Devices that compute apart: >= 2 CPU cores (or >= 2 GPUs with --device cuda; 4 processes need 4 GPUs); "
          "a sequence long enough that the split work dominates: each decided part's (attention's, the SSM's) "
          "one-process time >= 0.05 s, and one exchange of a key/value block between 2 processes <= 0.25x attention's "
          "per-process time. Where 4 processes share fewer CPU cores, each one's compute-thread CPU time stands for a "
          "core of its own (the split's critical path on 4 cores), and that stand-in is checked: a rank's scan of its "
          "quarter of the sequence takes 0.8-1.5x a quarter of the whole scan on one process (sharing the cores "
          "neither adds nor hides work); the 4-process wall time on the cores at hand is shown beside it.")
# The regime CHANGES quotes as it read before the stand-in was checked: stated, not measured.
_REGIME_PROXY_UNCHECKED = (
    "Devices that compute apart: >= 2 CPU cores (or >= 2 GPUs with --device cuda; 4 processes need 4 GPUs, on CPUs 4 "
    "processes share the cores and each one's CPU time stands for a core of its own); a sequence long enough that the "
    "split work dominates: each decided part's (attention's, the SSM's) one-process time >= 0.05 s, and one exchange "
    "of a key/value block between 2 processes <= 0.25x attention's per-process time.")
REGIME_OLD = ("... each part's one-process time >= 0.05 s, and one exchange of a key/value block between 2 processes "
              "<= 0.25x attention's per-process time.")
MIN_WORK_S, MAX_COMM_SHARE, STAND_IN = 0.05, 0.25, (0.8, 1.5)
CHANGES = [
    {"date": "2026-11-30", "what": "attention's time: the critical path in CPU time instead of wall time",
     "old": "wall time of the ring attention call, slowest process",
     "new": "largest compute-thread CPU time of any process during the call (wall time kept in the data)",
     "why": "The first measurement ran at load average 4.4 on 2 cores: two busy processes could not get a core "
            "each, so wall time measured the other tenants (0.91x), not the split. The LSTM keeps wall time: only "
            "one of its processes computes at a time."},
    {"date": "2026-11-30", "what": "method: peak memory is each part's resident high-water mark above its own start",
     "old": "getrusage's lifetime maximum RSS above the process's baseline; a zero peak passed the memory test",
     "new": "malloc_trim, then /proc/self/clear_refs 5, then VmHWM - VmRSS; a zero peak is a fault (inconclusive)",
     "why": ("At quick scale (2,048 tokens) both peaks read 0 MB (start-up had been larger), and 0/0 passed as "
             "0.00x. Verdict at quick scale before: inconclusive (0.58x time, '0.00x' memory); after: "
             "inconclusive (0.59x time, 0.88x memory). Thresholds unchanged.")},
    {"date": "2026-12-02", "what": "claim, prediction, threshold and method: a linear recurrence (the SSM) split "
                                   "beside the LSTM; rounds; memory and margins per call",
     "old": "claim 'a recurrence cannot [split]', tested only on an LSTM relay (which cannot split by construction); "
            "one launch per process count, 3 timed calls, ratios of the means beyond their spread; memory one "
            "reading per process count against 0.8 and 0.9; LSTM by wall time; the traced depth shown (claim 1 "
            "measures it, it is dropped here)",
     "new": "claim 'attention and a linear recurrence split, a nonlinear recurrence does not'; the SSM split by a "
            f"scan across 4 processes must reach <= {SSM_TIME}x (>= {NO_SPLIT}x refutes it), the LSTM at 2 and 4 "
            f"processes >= {LSTM_TIME}x; the LSTM's time is the sum of its chain's CPU times; 3 rounds of fresh "
            "processes (order alternated), each decided alone on ratio "
            "ranges over its calls, memory read per call with large allocations mapped (so resident memory follows "
            "the live tensors); REGIME: 2 devices, split work >= 0.05 s, one exchange <= 0.25x attention's time",
     "why": "Issue 29: 'a recurrence does not split' was tested only where it could not be wrong; a linear recurrence "
            "does split (Blelloch 1990; Martin & Cundy 2018). Five full runs at no code change read inconclusive, "
            "inconclusive, supported, inconclusive, supported: the memory ratio (0.69-0.83 against 0.8, one reading "
            "each, from glibc's heap high-water mark) and once the LSTM's wall-time spread (0.23 at load 1.6) decided "
            "the flips. Verdict before (reports/cpu-full, old wording): supported (attention 0.52x time, 0.73x memory; "
            "LSTM 1.03x); after, at quick scale (2 rounds): supported in both (attention 0.55x time, 0.75x memory; SSM "
            "0.54x at 4 processes; LSTM 1.05x at 2, 1.08x at 4); at full scale (3 rounds): supported in all three "
            "(attention 0.48x time, 0.70x memory; SSM 0.30x at 4 processes; LSTM 0.99x at 2, 1.00x at 4). The SSM "
            "is decided at 4 processes, not 2: at 2 its correction (up to one more scan) can cancel the gain "
            "(1.1-1.3x at quick scale, 0.64x at full)."},
    {"date": "2026-12-03", "what": "method: the LSTM's one-process time from the same launch (prediction and "
                                   "threshold unchanged)",
     "old": "the LSTM chain's time at 2 and 4 processes over its time in the 1-process launch, a range of min/max "
            "to max/min over calls",
     "new": "in each 2- and 4-process launch rank 0 also runs the whole sequence alone, before or after each relay "
            "call in turn; the ratio is each call's chain time over its pair's whole time, the range over the calls",
     "why": "Issue 29 (verdicts that hold across runs): the reference run at 2ef4f65 read supported, inconclusive, "
            "inconclusive over its 3 rounds because the 1-process launch's LSTM took 1.40 s in one round and 1.60-1.68 "
            "s in the others (the same work: launch-to-launch pace), which put the 2-process ratio's range at "
            "0.80-0.90 and 0.84-0.93 across the 0.9 threshold; attention (0.45-0.48x) and the SSM (0.5x) sat far from "
            "theirs. MEASURING.md: both sides on one clock, alternating. Verdict before: inconclusive (unstable); "
            "after (full scale, this claim alone, 416 s): supported in all 3 rounds (attention 0.56x time, 0.70x "
            "memory; SSM 0.48x at 4 processes; LSTM chain / whole 1.00-1.01x at 2 processes, 1.02-1.06x at 4, every "
            "call's ratio 0.97-1.07)."},
    {"date": "2026-12-03",
     "what": "method: attention over 4,096 tokens at full scale (the SSM and the LSTM keep 8,192)",
     "old": "every part over T = 8,192 tokens",
     "new": "ring attention (and its key/value exchange) over attn_T = 4,096 tokens; the SSM and the LSTM over 8,192",
     "why": ("Time budget (issue 29: the full report in an hour on 2 cores): attention's forward + backward grows as "
             "T^2 and took 15-16 s a call at 8,192 on one process, about 75 s of each round's 130, while the ratios "
             "it is decided on do not depend on T: a trial round at 4,096 measured 2 / 1 processes at 0.45-0.54x "
             "time and 0.72x memory (0.47-0.55x and 0.70x at 8,192 in the reference of 83d7463), one exchange "
             "0.01-0.04 s against 1.7 s of attention per process (regime: <= 0.25x). The recurrences keep 8,192: at "
             "4,096 their chains are half as long and their ratios noisier (one of two trial rounds with every part "
             "at 4,096 read inconclusive). Prediction, threshold and regime unchanged. Verdict before: supported "
             "(reference 83d7463, 3 of 3 rounds); after: the reference at this change.")},
]
CHANGES.append(
    {"date": "2026-12-05", "what": "threshold: the LSTM relay's ratios leave the verdict (shown)",
     "old": (f"A round is supported if attention's time ratio at 2 is <= {ATTN_TIME}, its memory ratio <= {ATTN_MEM}, "
             f"the SSM's time ratio at 4 <= {SSM_TIME} and the LSTM's at 2 and at 4 >= {LSTM_TIME}; not supported if "
             f"attention's ratio at 2 or the SSM's at 4 is >= {NO_SPLIT} (it did not split), attention's memory ratio "
             f">= {NO_MEM}, or the LSTM's at 2 or 4 <= {ATTN_TIME} (the nonlinear recurrence split after all); "
             "otherwise inconclusive. Regime: " + REGIME_OLD),
     "new": _THRESHOLD_SSM_ACROSS_LAUNCHES + " Regime: " + _REGIME_PROXY_UNCHECKED,
     "why": ("Issue 29's independent read: the relay sums the chain's links, each rank waiting for the previous one's "
             "state, so its ratio is about 1 by construction (reference 679adec: 0.99-1.06) and this half could not "
             "come out the other way; this module's caveats already said so. What could refute 'a nonlinear "
             "recurrence does not split' is a parallel method for one (fixed-point iteration over chunks, as in DEER, "
             "Lim et al. 2024), not built here; until it is, the claim's nonlinear half is shown, not evidenced. The "
             "linear recurrence (the SSM's scan) stays decided: it is where 'a recurrence does not split' can be, "
             "and is, wrong. Verdict before: supported (679adec, 3 of 3 rounds); after, on the same data: "
             "supported (3 of 3 rounds).")})
CHANGES.append(
    {"date": "2026-12-07", "what": "regime: the CPU-time stand-in for 4 cores checked where 4 processes share fewer",
     "old": _REGIME_PROXY_UNCHECKED,
     "new": _REGIME_STAND_IN_ACROSS_LAUNCHES,
     "why": ("Issue 29's independent read: the SSM half is decided at 4 processes, which a 2-core machine runs 2 to a "
             "core; its ratio (0.50-0.56) is per-process CPU time, a stand-in for 4 cores that the regime stated but "
             "did not measure, while the 4-process wall time here reads 0.85-0.90x (median over median, by round) and "
             "the 2-process ratio (the split "
             "the 2 cores do run apart) 1.08-1.13x (the correction costs a second scan: no gain at 2, as predicted). "
             "The stand-in now has a measured condition: each rank's scan of its quarter must cost its share of the "
             "one-process scan (0.8-1.5x), so a split whose CPU time hid work or was inflated by sharing reads "
             "'regime not reached'; the wall time is shown. Not adopted: requiring 4 cores for the SSM half (it would "
             "never be measured on the 2 cores the report is sized for); a process's CPU time counts only its own "
             "work, and sharing a core can only inflate it, so the stand-in errs toward a split that gains less, never "
             "toward one that did not happen. Prediction and threshold unchanged. Verdict before: "
             "supported (reference b1c16d5, 3 of 3 rounds); after: the reference at this change (the chunk scan's "
             "own time was not recorded before).")})
CHANGES.append(
    {"date": "2026-12-07", "what": "method: the SSM's one-process scan from the same launch (prediction, threshold "
                                   "values and regime bounds unchanged)",
     "old": "THRESHOLD: " + _THRESHOLD_SSM_ACROSS_LAUNCHES + " REGIME: " + _REGIME_STAND_IN_ACROSS_LAUNCHES,
     "new": "THRESHOLD: " + THRESHOLD + " REGIME: " + REGIME,
     "why": ("The reference at 6685c0e read inconclusive (regime not reached): the stand-in check read 0.81, 0.70 and "
             "0.95 over its 3 rounds because round 2's one-process launch scanned the same sequence in 0.44-0.52 s "
             "against 0.35-0.44 s in the other rounds, so every ratio over it read low (the decided 4 / 1 ratio 0.45, "
             "0.39, 0.52; the 4-process wall time 0.66x). That is launch-to-launch pace, which the LSTM's ratio "
             "stopped depending on at the 2026-12-03 change; the SSM's decided ratio and its check now take the same "
             "remedy (MEASURING.md: both sides on one clock, alternating). Verdict before: inconclusive (regime not "
             "reached; reference 6685c0e); after: the reference at this change (the paired whole scan was not "
             "recorded before).")})
EST_S = {"quick": 85, "full": 290}
SETUPS = {"quick": dict(T=2048, H=8, D=128, lstm_dim=512, ssm_dim=1024, ssm_state=16, ssm_batch=2, calls=3, rounds=2),
          "full": dict(T=8192, attn_T=4096, H=8, D=128, lstm_dim=512, ssm_dim=1024, ssm_state=16, ssm_batch=2, calls=3,
                       rounds=FULL_REPEATS)}
PARTS = ("attn", "ssm", "lstm")
DECIDED = ("attn", "ssm")  # the LSTM relay is shown


def _devices(device: str) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def _row(P: int, res: list[dict]) -> dict:
    """One launch's figures per call: each part's critical path over the ranks, and attention's peak memory."""
    calls = range(len(res[0]["ssm_scan_s"]))
    row = {"processes": P,
           "ssm_s": [max(r["ssm_scan_s"][i] for r in res) + max(r["ssm_fix_s"][i] for r in res) for i in calls],
           "ssm_chunk_scan_s": [max(r["ssm_scan_s"][i] for r in res) for i in calls],  # phase 1 alone: the stand-in check
           "ssm_wall_s": [max(r["ssm_wall_s"][i] for r in res) for i in calls],
           "ssm_whole_s": res[0].get("ssm_whole_s", []),  # rank 0 alone over the whole sequence, same launch (P > 1)
           "ssm_whole_wall_s": res[0].get("ssm_whole_wall_s", []),
           "lstm_s": [sum(r["lstm_s"][i] for r in res) for i in calls],  # a chain: its links' times add up
           "lstm_whole_s": res[0]["lstm_whole_s"],  # rank 0 alone over the whole sequence, same launch (P > 1)
           "lstm_wall_s": [max(r["lstm_wall_s"][i] for r in res) for i in calls]}
    if res[0]["attn_s"]:
        row.update(attn_s=[max(r["attn_s"][i] for r in res) for i in calls],
                   attn_wall_s=[max(r["attn_wall_s"][i] for r in res) for i in calls],
                   attn_peak_bytes=[max(r["attn_peak_bytes"][i] for r in res) for i in calls],
                   comm_s=max(r["comm_s"] for r in res))
    return row


SIDES = {1: "one", 2: "two", 4: "four"}


def measure(scale: str, device: str) -> dict:
    from attnlab.distributed.group import run_local
    from attnlab.runtime import machine_context

    setup = SETUPS[scale]
    devices = _devices(device)
    on_gpu = torch.device(device).type == "cuda"
    counts = [P for P in SIDES if P <= (devices if on_gpu else max(devices, 4))]
    rounds = []
    if devices >= 2:
        for i in range(setup["rounds"]):
            rnd = {}
            for P in (counts if i % 2 == 0 else counts[::-1]):  # reverse the order every other round: drift
                parts = PARTS if P <= 2 else ("ssm", "lstm")  # attention's claim is decided at 2
                res = run_local(split_probe.rank_work, P, setup, device, parts, timeout_s=900, threads=1,
                                device=device)
                rnd[SIDES[P]] = _row(P, res)
            rounds.append(rnd)
    return {"setup": setup, "device": device, "devices": devices, "load_avg": os.getloadavg(), "rounds": rounds,
            "context": machine_context(dtype="fp32")}


def _range(one: list, two: list) -> tuple[float, float, float]:
    """(low, ratio of the medians, high) of two / one over the calls: min/max to max/min."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return min(two) / max(one), med(two) / med(one), max(two) / min(one)


def _pairs(split: list, whole: list) -> tuple[float, float, float]:
    """(low, median, high) over the calls of split / whole, call i's pair run back to back in one launch (its order
    alternating)."""
    ratios = sorted(c / w for c, w in zip(split, whole))
    return ratios[0], ratios[len(ratios) // 2], ratios[-1]


def _paired(row: dict, part: str = "lstm") -> tuple[float, float, float]:
    """``part``'s split time / the whole sequence's on rank 0 in the same launch, over the calls."""
    return _pairs(row[f"{part}_s"], row[f"{part}_whole_s"])


def _ssm_ratio(one: dict, side: dict) -> tuple[float, float, float]:
    """The SSM's P / 1: paired within the P-process launch; runs before that change, across launches."""
    return _paired(side, "ssm") if side.get("ssm_whole_s") else _range(one["ssm_s"], side["ssm_s"])


def _wall_ratio(rnd: dict) -> tuple[float, float, float]:
    """The SSM split's wall time at 4 processes over the whole scan's: paired in the launch where recorded (rank 0
    alone while the others wait), else across launches."""
    four = rnd["four"]
    if four.get("ssm_whole_wall_s"):
        return _pairs(four["ssm_wall_s"], four["ssm_whole_wall_s"])
    return _range(rnd["one"]["ssm_wall_s"], four["ssm_wall_s"])


def _stand_in(one: dict, four: dict) -> float:
    """A rank's scan of its quarter x 4 over the whole scan: the median over the calls' pairs in the 4-process launch
    (runs before that change: over the median of the 1-process launch's scans)."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    if four.get("ssm_whole_s"):
        return med([4 * c / w for c, w in zip(four["ssm_chunk_scan_s"], four["ssm_whole_s"])])
    return 4 * med(four["ssm_chunk_scan_s"]) / med(one["ssm_s"])


def _conditions(m: dict, rnd: dict | None) -> list[dict]:
    dev = "GPUs" if str(m.get("device", "")).startswith("cuda") else "CPU cores"
    conds = [condition("devices", m["devices"], f">= 2 {dev}", m["devices"] >= 2)]
    if rnd is None:
        return conds
    conds.append(condition("process counts measured", ", ".join(str(rnd[k]["processes"]) for k in rnd),
                           "1, 2 and 4", set(rnd) == set(SIDES.values())))
    one, two = rnd["one"], rnd.get("two", {})
    work = min(min(one[f"{p}_s"]) for p in DECIDED)
    conds.append(condition("one-process time of the smallest decided part", work, f">= {MIN_WORK_S} s", work >= MIN_WORK_S,
                           f"{work:.3f} s"))
    share = two.get("comm_s", float("nan")) / max(min(two.get("attn_s", [1.0])), 1e-12)
    conds.append(condition("one key/value exchange / attention's per-process time", share, f"<= {MAX_COMM_SHARE}",
                           share <= MAX_COMM_SHARE, f"{share:.3f}"))
    four = rnd.get("four", {})
    if dev == "CPU cores" and m["devices"] < 4 and four.get("ssm_chunk_scan_s"):
        own = _stand_in(one, four)
        lo, hi = STAND_IN
        whole = "the whole scan in the same launch" if four.get("ssm_whole_s") else "the one-process scan"
        conds.append(condition(f"4 processes on {m['devices']} cores: a rank's scan of a quarter x 4 / {whole} "
                               "(CPU time stands for a core each)", own, f"{lo}-{hi}x", lo <= own <= hi,
                               f"{own:.2f}x"))
    return conds


def decide_round(m: dict, rnd: dict) -> Decision:
    """One round: the ratio ranges of its calls against the thresholds."""
    one, two, four = rnd["one"], rnd["two"], rnd["four"]
    attn = _range(one["attn_s"], two["attn_s"])
    ssm2, ssm4 = _ssm_ratio(one, two), _ssm_ratio(one, four)
    lstm2, lstm4 = _paired(two), _paired(four)
    peaks = one["attn_peak_bytes"] + two["attn_peak_bytes"]
    mem = _range(one["attn_peak_bytes"], two["attn_peak_bytes"]) if min(peaks) > 0 else None
    show = lambda r: f"{r[1]:.2f} (range {r[0]:.2f}-{r[2]:.2f})"  # noqa: E731
    reasons = [f"{SHOWN} (a relay cannot split by construction): LSTM split in time / the whole sequence "
               f"in the same launch, 2 processes: {show(lstm2)}, 4: {show(lstm4)}",
               f"attention fwd+bwd critical path, 2 processes / 1: {show(attn)} (<= {ATTN_TIME}?)",
               "attention peak memory per process, 2 / 1: " + (f"{show(mem)} (<= {ATTN_MEM}?)" if mem else
                                                                "a peak read 0 bytes: a measurement fault"),
               f"SSM scan split across processes, 4 / 1: {show(ssm4)} (<= {SSM_TIME}?); 2 / 1: {show(ssm2)} "
               "(not in the verdict)" + (" (each over the whole sequence on rank 0 in the same launch)"
                                         if four.get("ssm_whole_s") else "")]

    if mem is None:
        ok = None
    elif attn[0] >= NO_SPLIT or ssm4[0] >= NO_SPLIT or mem[0] >= NO_MEM:
        ok = False
    elif attn[2] <= ATTN_TIME and mem[2] <= ATTN_MEM and ssm4[2] <= SSM_TIME:
        ok = True
    else:
        ok = None
        reasons.append("a ratio's range reaches across a threshold: inconclusive")
    T, attn_T = m["setup"]["T"], m["setup"].get("attn_T", m["setup"]["T"])
    figure = (f"at {T:,} tokens ({attn_T:,} for attention), 2 processes vs 1: attention {attn[1]:.2f}x the time and "
              f"{mem[1] if mem else float('nan'):.2f}x the memory per process; 4 vs 1: SSM {ssm4[1]:.2f}x; "
              f"LSTM relay (shown) {lstm2[1]:.2f}x at 2, {lstm4[1]:.2f}x at 4")
    return Decision(verdict(ok), figure, reasons)


def decide(m: dict) -> Decision:
    if not m["rounds"]:
        return in_regime(_conditions(m, None), Decision(verdict(None), f"not run: {m['devices']} device(s)",
                                                        ["the 2-process runs need 2 devices"]))
    decisions = [in_regime(_conditions(m, r), decide_round(m, r) if set(r) == set(SIDES.values()) else
                           Decision(verdict(None), "not every process count ran", ["not every process count ran"]))
                 for r in m["rounds"]]
    d = over_repeats(decisions)
    if m["devices"] < 4 and not str(m.get("device", "")).startswith("cuda"):
        walls = [_wall_ratio(r) for r in m["rounds"]
                 if r.get("four", {}).get("ssm_wall_s") and r.get("one", {}).get("ssm_wall_s")]
        if walls:
            paired = all(r.get("four", {}).get("ssm_whole_wall_s") for r in m["rounds"])
            d.reasons.append(f"{SHOWN}: the SSM split's wall time, 4 processes on {m['devices']} cores / 1"
                             + (" (the whole scan's on rank 0 in the same launch)" if paired else "") + ", by round: "
                             + ", ".join(f"{w[1]:.2f} (range {w[0]:.2f}-{w[2]:.2f})" for w in walls)
                             + " (the cores at hand bound it; the decided ratio is per-process CPU time)")
    d.reasons.append(f"load average {m['load_avg'][0]:.1f} while measuring (CPU times exclude other tenants' turns)")
    return d


def _means(m: dict, key: str) -> tuple[list, list]:
    """(process counts, the mean over rounds of ``key``'s mean per count) where measured."""
    P = [P for P, side in SIDES.items() if all(key in r.get(side, {}) for r in m["rounds"])]
    return P, [mean([mean(r[SIDES[p]][key]) for r in m["rounds"]]) for p in P]


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    d = decide(m)
    if not m["rounds"]:
        return Outcome.of(d, m, caveats=[f"{m['devices']} device(s): nothing split"], device=device)
    table = [{"round": i + 1, "processes": row["processes"], **{f"{p}_s": mean(row[f"{p}_s"]) for p in PARTS
                                                                 if f"{p}_s" in row},
              **({"attention_peak_MB": mean(row["attn_peak_bytes"]) / 1e6, "exchange_ms": row["comm_s"] * 1e3}
                 if "attn_s" in row else {}),
              **({"lstm_chain_over_whole": _paired(row)[1]} if row.get("lstm_whole_s") else {})}
             for i, r in enumerate(m["rounds"]) for row in r.values()]
    series = [Series(label, *_means(m, f"{p}_s")) for p, label in
              (("attn", "ring attention fwd+bwd"), ("ssm", "SSM scan (split by summaries)"),
               ("lstm", "LSTM (relay of its state)"))]
    P_mem, mem = _means(m, "attn_peak_bytes")
    return Outcome.of(d, m,
                      [Plot("Critical-path time at a fixed total length (mean over rounds)", "processes", "seconds",
                            series),
                       Plot("Attention's peak memory per process", "processes", "MB",
                            [Series("ring attention", P_mem, [b / 1e6 for b in mem])])],
                      table,
                      [f"{m['devices']} devices; one thread per process. The recurrences run over "
                       f"{m['setup']['T']:,} tokens, attention over {m['setup'].get('attn_T', m['setup']['T']):,} "
                       "(its cost grows as the square of the length, the ratios it is decided on do not). Times "
                       "are critical paths of per-process CPU time, what the split takes with a core per process; 4 processes share the cores here. "
                       f"Load average {m['load_avg'][0]:.1f} while measuring.",
                       "Memory: each call's resident high-water mark above its own start, large allocations mapped "
                       "and unmapped with the tensors (on a GPU: max_memory_allocated).",
                       "The LSTM relay is the only exact split of a nonlinear recurrence: process p starts only when "
                       "p-1 hands over its final state, so this half shows the chain's length and cannot come out "
                       "otherwise; the SSM's split is where 'a recurrence does not split' could be (and is) wrong.",
                       "The SSM's split costs every rank but the first a scan and a correction (about one more scan), "
                       "so its critical path is about 2T/P: no gain at 2 processes, about half at 4."],
                      device=device)
