"""The ``recsys`` subcommand: next-item recommendation, SASRec against GRU4Rec, Markov and popularity baselines
(argparse + a call into attnlab.recsys.run)."""
from __future__ import annotations

import json
import sys

from attnlab.cli_args import add_threads
from attnlab.runtime import set_threads


def cmd_recsys(args) -> int:
    from attnlab.recsys.models import MODELS
    from attnlab.recsys.run import format_table, run_recsys
    from attnlab.recsys.train import FitConfig

    threads = set_threads(args.threads)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    fit_cfg = FitConfig(loss=args.loss, lr=args.lr, batch_size=args.batch_size, max_epochs=args.epochs,
                        patience=args.patience, schedule=args.schedule, warmup_epochs=args.warmup_epochs,
                        beta2=args.beta2, shift_windows=not args.fixed_windows, ema=args.ema,
                        label_smoothing=args.label_smoothing)
    if args.data == "ml-100k" and not args.json:
        print("attnlab recsys: MovieLens-100K from the RecBole 1.2.1 wheel (fetched with pip on first use)",
              file=sys.stderr)
    result = run_recsys(args.data, models or list(MODELS), args.seeds, args.max_len, fit_cfg,
                        progress=not args.quiet and not args.json)
    result["threads"] = threads
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def add_recsys_command(sub) -> None:
    from attnlab.recsys.train import SCHEDULES, FitConfig

    p = sub.add_parser("recsys", help="next-item recommendation: sasrec vs gru4rec, markov and pop, on ML-100K, "
                                      "a file or synthetic histories")
    p.add_argument("--data", default="synthetic",
                   help="ml-100k (fetched once from the package registry), synthetic (default) or synthetic:long-range / "
                        "synthetic:habits, or a path: RecBole "
                        ".inter, MovieLens ratings.dat / u.data / ratings.csv, or a user,item,timestamp .csv")
    p.add_argument("--models", default="sasrec,gru4rec,markov,pop", help="comma-separated, from sasrec,gru4rec,markov,pop")
    p.add_argument("--seeds", type=int, default=3, help="seeds per neural model (markov and pop are deterministic)")
    p.add_argument("--max-len", type=int, default=50, help="inputs keep each user's last MAX_LEN items")
    p.add_argument("--epochs", type=int, default=FitConfig.max_epochs,
                   help="most epochs (a decaying schedule reaches 0 there); early stopping on validation NDCG@10 first")
    p.add_argument("--patience", type=int, default=FitConfig.patience,
                   help="epochs without a better validation NDCG@10 before stopping")
    p.add_argument("--loss", default="ce", choices=("ce", "bce"),
                   help="ce: cross-entropy over all items (default); bce: one sampled negative per position")
    p.add_argument("--lr", type=float, default=FitConfig.lr, help="peak learning rate")
    p.add_argument("--schedule", default=FitConfig.schedule, choices=SCHEDULES,
                   help="learning rate after warm-up: constant, or cosine / linear decay to 0 at the last epoch")
    p.add_argument("--warmup-epochs", type=float, default=FitConfig.warmup_epochs, help="linear warm-up length")
    p.add_argument("--beta2", type=float, default=FitConfig.beta2, help="AdamW's second-moment decay")
    p.add_argument("--ema", type=float, default=FitConfig.ema,
                   help="decay per step of the weight average that is evaluated and kept (0: the raw weights)")
    p.add_argument("--label-smoothing", type=float, default=FitConfig.label_smoothing,
                   help="ce loss: share of each target's probability spread over every item")
    p.add_argument("--fixed-windows", action="store_true",
                   help="cut the training histories the same way every epoch (default: new cuts each epoch)")
    p.add_argument("--batch-size", type=int, default=FitConfig.batch_size,
                   help="training windows (of up to MAX_LEN items) per step")
    add_threads(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_recsys)
