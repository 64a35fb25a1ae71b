"""What every result records about where it ran: CPU/GPU, threads, versions, date, command."""
from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_context(seed: int | None = None, dtype: str = "fp32") -> dict:
    import torch

    return {"cpu": cpu_name(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": sys.version.split()[0],
            "dtype": dtype, "seed": seed, "command": " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
