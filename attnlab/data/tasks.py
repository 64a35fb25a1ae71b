"""Training tasks: each yields batch ``step`` deterministically from (seed, step).

Because a batch depends only on the seed and the step number, resuming at step s replays exactly the
batches an uninterrupted run would have seen, with no data-loader state to save.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.config import TrainConfig
from attnlab.data.corpus import load_corpus
from attnlab.data.synthetic import copy_batch, mqar_batch
from attnlab.data.tokenizers import BPETokenizer, ByteTokenizer
from attnlab.errors import DataError


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


@dataclass
class CorpusTask:
    cfg: TrainConfig
    tokenizer: object
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    info: dict = field(default_factory=dict)
    synthetic = False

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _windows(self, ids: torch.Tensor, offsets: torch.Tensor):
        idx = offsets[:, None] + torch.arange(self.cfg.seq_len + 1)  # (B, T+1)
        seq = ids[idx].long()
        return seq[:, :-1], seq[:, 1:]

    def batch(self, step: int):
        g = step_generator(self.cfg.seed, step)
        offsets = torch.randint(0, len(self.train_ids) - self.cfg.seq_len - 1, (self.cfg.batch_size,), generator=g)
        return self._windows(self.train_ids, offsets)

    def eval_batches(self, seq_len: int | None = None):
        """Evenly spaced held-out windows: the same ones at every evaluation."""
        T = seq_len or self.cfg.seq_len
        n = self.cfg.eval_batches * self.cfg.batch_size
        last = len(self.val_ids) - T - 1
        if last < 1:
            raise DataError(f"validation split has {len(self.val_ids)} tokens, fewer than seq_len+1={T + 1}; "
                            "use a shorter --seq-len or more data")
        offsets = torch.linspace(0, last, n).long()
        saved, self.cfg.seq_len = self.cfg.seq_len, T
        try:
            return [self._windows(self.val_ids, offsets[i:i + self.cfg.batch_size])
                    for i in range(0, n, self.cfg.batch_size)]
        finally:
            self.cfg.seq_len = saved


@dataclass
class SyntheticTask:
    cfg: TrainConfig
    info: dict = field(default_factory=dict)
    synthetic = True
    tokenizer = None

    @property
    def vocab_size(self) -> int:
        return self.cfg.synth_vocab

    def _make(self, g: torch.Generator, batch_size: int):
        c = self.cfg
        if c.task == "copy":
            return copy_batch(batch_size, c.seq_len, c.synth_vocab, g)
        return mqar_batch(batch_size, c.seq_len, c.synth_vocab, c.n_pairs, g)

    def batch(self, step: int):
        return self._make(step_generator(self.cfg.seed, step), self.cfg.batch_size)

    def eval_batches(self, seq_len: int | None = None):
        # A seed stream disjoint from training's (training uses seed * 1_000_003 + step >= 0).
        g = torch.Generator().manual_seed(2**62 + self.cfg.seed)
        return [self._make(g, self.cfg.batch_size) for _ in range(self.cfg.eval_batches)]


def make_task(cfg: TrainConfig, out_dir: str | Path | None = None, resume: bool = False):
    """Build the task; a BPE tokenizer is trained on the training split (or reloaded when resuming)."""
    if cfg.task != "corpus":
        task = SyntheticTask(cfg)
        task.batch(0)  # validates vocab / n_pairs / seq_len now, with a clear error
        return task
    corpus = load_corpus(cfg.data, cfg.corpus_max_bytes)
    if cfg.tokenizer == "byte":
        tok = ByteTokenizer()
        train_ids = torch.frombuffer(bytearray(corpus.train), dtype=torch.uint8)
        val_ids = torch.frombuffer(bytearray(corpus.val), dtype=torch.uint8)
    else:
        tok_path = Path(out_dir) / "tokenizer.json" if out_dir else None
        if resume and tok_path is not None and tok_path.exists():
            tok = BPETokenizer.load(tok_path)
        else:
            texts = corpus.train.decode("utf-8", errors="replace").split("\n\n")
            tok = BPETokenizer.train(texts, cfg.bpe_vocab_size)
        train_ids = torch.tensor(tok.encode(corpus.train.decode("utf-8", errors="replace")), dtype=torch.int32)
        val_ids = torch.tensor(tok.encode(corpus.val.decode("utf-8", errors="replace")), dtype=torch.int32)
    if len(train_ids) <= cfg.seq_len + 1:
        raise DataError(f"training split has {len(train_ids)} tokens, not more than seq_len+1={cfg.seq_len + 1}; "
                        "use a shorter --seq-len or more data")
    info = {"source": corpus.source, "files": corpus.n_files, "fingerprint": corpus.fingerprint,
            "train_tokens": len(train_ids), "val_tokens": len(val_ids)}
    return CorpusTask(cfg, tok, train_ids, val_ids, info)
