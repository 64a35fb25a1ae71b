"""``attnlab explain``: open the explainer's page on a checkpoint or a Hugging Face folder (attnlab/explain)."""
from __future__ import annotations

import sys
from pathlib import Path

from attnlab.cli_args import add_threads
from attnlab.runtime import set_threads


def cmd_explain(args) -> int:
    import uvicorn

    from attnlab.explain.app import create_app
    from attnlab.explain.views import Explained
    from attnlab.resolve import load_model

    set_threads(args.threads)
    loaded = load_model(args.checkpoint)
    loaded.model.eval()
    ex = Explained(loaded.model, loaded.tokenizer, Path(args.checkpoint).resolve().name)
    app = create_app(ex, calibrate=not args.no_calibrate)
    print(f"attnlab explain: {ex.name} ({ex.cfg.family}, {ex.cfg.n_layers} layers) on http://{args.host}:{args.port}/"
          + ("" if args.no_calibrate else " - measuring this machine for the grid view's predictions (once, cached)"),
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def add_explain_command(sub) -> None:
    p = sub.add_parser("explain", help="look inside the mechanism on your own model: attention heatmaps, the "
                                       "budget, prefill vs decode, the n^2 grid, order, a recurrence (a web page)")
    p.add_argument("checkpoint", help="attnlab checkpoint folder (attnlab demo / train) or Hugging Face model folder")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="skip measuring this machine: the grid view then shows measurements without predictions")
    add_threads(p)
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_explain)
