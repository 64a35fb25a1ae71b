"""Claim 11: an input token costs less than an output token."""
import torch

from attnlab.config import preset
from attnlab.cost import Workload, estimate, resolve
from attnlab.cost import hardware
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "Input is cheaper than output"
CLAIM = "Per token, reading input (prefill, parallel) costs much less time than producing output (decode, sequential)."
PREDICTION = ("Here, seconds per output token exceed seconds per input token several-fold; on the GPU presets the "
              "roofline ratio is far larger, since decode is memory-bound while prefill is compute-bound.")
THRESHOLD = "Supported if the measured output/input ratio is >= 3 here and the modelled ratio is >= 10 on every GPU preset."


def run(scale: str, device: str) -> Outcome:
    torch.manual_seed(0)
    cfg = preset("small-10m")
    model = set_precision(build_model(cfg, device), "fp32")
    ids = torch.randint(0, 256, (512,)).tolist()
    generate(model, ids, 2)
    st = generate(model, ids, 32 if scale == "quick" else 128).stats
    here = st.tpot_s / (st.ttft_s / len(ids))
    gpus = {}
    for hw in ("h100-sxm", "h200", "a100-80gb", "rtx-4090"):
        e = estimate(resolve("llama-3-8b"), Workload(2048, 256), hardware.get(hw))
        gpus[hw] = e["output_over_input_cost"]
    ok = here >= 3 and min(gpus.values()) >= 10
    names = list(gpus)
    rows = [{"where": f"this machine's {device} (measured, 10M model, fp32)", "input_s_per_token": st.ttft_s / len(ids),
             "output_s_per_token": st.tpot_s, "ratio": here}]
    rows += [{"where": f"{h} (modelled, llama-3-8b bf16)", "ratio": gpus[h]} for h in names]
    return Outcome(verdict(ok), f"output/input cost: {here:.0f}x here, {min(gpus.values()):.0f}-{max(gpus.values()):.0f}x "
                   "modelled on GPUs", {"measured_ratio": here, "modelled_ratio": gpus},
                   [Plot("Output-token cost / input-token cost", "(0 = here, then " + ", ".join(names) + ")", "ratio",
                         [Series("ratio", list(range(len(names) + 1)), [here] + [gpus[h] for h in names])], log_y=True)],
                   rows, ["GPU figures come from the cost model's roofline, not measurements."])
