"""Typed configs for models and training, with presets and strict JSON loading.

Configs are data: they are saved as JSON beside every checkpoint and result, and loading rejects
unknown fields instead of silently ignoring them. Validation lives in ``__post_init__`` and raises
``ConfigError`` naming the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import ConfigError

FAMILIES = ("transformer", "rnn", "lstm", "gru", "linear", "ssm")
RECURRENT_FAMILIES = ("rnn", "lstm", "gru")
MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
# The names the model registries answer to (models.attention.KERNELS, models.positional.POSITIONAL); spelled here so
# that checking a config needs no model code, and a test checks that the registries hold exactly these.
KERNEL_NAMES = ("naive", "sdpa", "flash", "sliding", "block_sparse")
POSITIONAL_NAMES = ("none", "sinusoidal", "learned", "rope", "alibi")
ROPE_SCALINGS = ("linear", "dynamic", "ntk", "llama3")
TASKS = ("corpus", "copy", "mqar")
TOKENIZERS = ("byte", "bpe")


def _choice(name: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not known; choose one of: {', '.join(allowed)}")


def _positive(name: str, value: int | float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


@dataclass
class ModelConfig:
    """One sequence model. Attention fields are ignored by the recurrent families."""

    family: str = "transformer"
    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (plain multi-head); fewer -> grouped-query
    head_dim: int | None = None  # None -> dim // n_heads
    hidden_dim: int | None = None  # MLP width; None -> 4*dim (gelu) or the 2/3-scaled width (swiglu)
    mlp: str = "gelu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    pos: str = "rope"
    kernel: str = "sdpa"
    causal: bool = True
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"type": linear|dynamic|ntk|llama3, "factor": f, ...} (see positional.py)
    tie_embeddings: bool = True
    bias: bool = False
    qkv_bias: bool = False  # a bias on the q/k/v projection only (Qwen2); `bias` puts one on every linear
    dropout: float = 0.0
    init_std: float = 0.02
    fused: bool = False  # recurrent only: torch's fused nn.RNN/LSTM/GRU kernel instead of the visible loop
    window: int = 256  # kernel "sliding": keys per query; its decode cache holds exactly this many positions
    block_size: int = 0  # kernel "block_sparse": block length b (0 -> isqrt(max_seq_len))
    chunk_size: int = 64  # family "linear": chunk length of the parallel form
    ssm_state: int = 16  # family "ssm": state size N per channel
    ssm_expand: int = 2  # family "ssm": inner width = ssm_expand * dim
    scan: str = "parallel"  # family "ssm": "parallel" (log-depth) or "sequential" (a loop over T)
    short_conv: int = 4  # families "linear", "ssm": causal depthwise convolution width before the mixer; 0: none
    ssm_gate_bias: float | None = 2.0  # family "ssm": the output gate is silu(z + b), b learned per channel from this
    # start (an open gate); None: Mamba's silu(z), no parameter

    def __post_init__(self) -> None:
        _choice("family", self.family, FAMILIES)
        _choice("mlp", self.mlp, MLPS)
        _choice("norm", self.norm, NORMS)
        _choice("pos", self.pos, POSITIONAL_NAMES)
        _choice("kernel", self.kernel, KERNEL_NAMES)
        _choice("scan", self.scan, ("parallel", "sequential"))
        for name in ("window", "chunk_size", "ssm_state", "ssm_expand"):
            _positive(name, getattr(self, name))
        _positive("block_size", self.block_size, allow_zero=True)
        _positive("short_conv", self.short_conv, allow_zero=True)
        if self.ssm_gate_bias is not None and (isinstance(self.ssm_gate_bias, bool)
                                               or not isinstance(self.ssm_gate_bias, (int, float))):
            raise ConfigError(f"ssm_gate_bias={self.ssm_gate_bias!r} must be a number (the gate bias's start) or "
                              "null (Mamba's gate, no bias)")
        for name in ("bias", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        if self.block_size == 0:
            import math

            self.block_size = max(1, math.isqrt(self.max_seq_len))
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            _positive(name, getattr(self, name))
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout!r} must be in [0, 1)")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        _positive("n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                "(each key/value head serves a whole group of query heads)")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ConfigError(f"n_heads={self.n_heads} must divide dim={self.dim}, or set head_dim explicitly")
            self.head_dim = self.dim // self.n_heads
        _positive("head_dim", self.head_dim)
        if self.family in ("linear", "ssm") and self.pos in ("rope", "alibi"):
            raise ConfigError(f"family={self.family!r} has no attention scores for pos={self.pos!r} to act on; "
                              "use pos none, sinusoidal or learned")
        if self.pos == "rope" and self.head_dim % 2:
            raise ConfigError(f"pos='rope' needs an even head_dim, got {self.head_dim}")
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict) or self.rope_scaling.get("type") not in ROPE_SCALINGS:
                raise ConfigError(f"rope_scaling={self.rope_scaling!r} needs a 'type' among {', '.join(ROPE_SCALINGS)}")
            if not float(self.rope_scaling.get("factor", 0)) > 0:
                raise ConfigError(f"rope_scaling factor must be > 0, got {self.rope_scaling.get('factor')!r}")
        if self.pos == "sinusoidal" and self.dim % 2:
            raise ConfigError(f"pos='sinusoidal' needs an even dim, got {self.dim}")
        if self.hidden_dim is None:
            if self.mlp == "swiglu":  # Llama: 2/3 of 4*dim keeps the parameter count of a 4*dim GELU MLP
                self.hidden_dim = 64 * ((int(8 * self.dim / 3) + 63) // 64)
            else:
                self.hidden_dim = 4 * self.dim
        _positive("hidden_dim", self.hidden_dim)

    @property
    def is_recurrent(self) -> bool:
        return self.family in RECURRENT_FAMILIES

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ModelConfig":
        """A config read back (to_dict writes every field). A linear / SSM config without ``short_conv`` was
        written before the short convolution existed, an SSM config without ``ssm_gate_bias`` before the gate's bias:
        its weights have neither, so it is built without."""
        if isinstance(data, dict) and data.get("family") in ("linear", "ssm") and "short_conv" not in data:
            data = {**data, "short_conv": 0}
        if isinstance(data, dict) and data.get("family") == "ssm" and "ssm_gate_bias" not in data:
            data = {**data, "ssm_gate_bias": None}
        return _strict(cls, data, source)


@dataclass
class TrainConfig:
    """What to train on and how. The data fields select and shape the task."""

    task: str = "corpus"
    data: str | None = None  # a file or folder; None -> the embedded corpus (Python's stdlib sources)
    tokenizer: str = "byte"
    bpe_vocab_size: int = 2048
    corpus_max_bytes: int = 8_000_000  # cap on the embedded/user corpus read, to keep start-up fast
    synth_vocab: int = 64  # copy / mqar vocabulary
    n_pairs: int = 8  # mqar key-value pairs
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 0
    device: str = "cpu"
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 8
    save_every: int = 100  # 0 -> only at the end
    # Knowledge distillation: a checkpoint (or Hugging Face folder) whose next-token distributions the model
    # learns to match, e.g. a speculative-decoding draft imitating its target. Loss = (1 - w) * cross-entropy
    # on the data + w * KL(teacher || student), w = distill_weight. distill_temperature < 1 sharpens the
    # teacher towards its argmax (what a greedy draft must match).
    distill_from: str | None = None
    distill_weight: float = 1.0
    distill_temperature: float = 1.0

    def __post_init__(self) -> None:
        _choice("task", self.task, TASKS)
        _choice("tokenizer", self.tokenizer, TOKENIZERS)
        _choice("device", self.device, ("cpu", "cuda"))
        for name in ("steps", "batch_size", "seq_len", "log_every", "eval_every", "eval_batches",
                     "synth_vocab", "n_pairs", "bpe_vocab_size", "corpus_max_bytes"):
            _positive(name, getattr(self, name))
        for name in ("warmup_steps", "weight_decay", "grad_clip", "save_every", "seed"):
            _positive(name, getattr(self, name), allow_zero=True)
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if not 0 <= self.distill_weight <= 1:
            raise ConfigError(f"distill_weight={self.distill_weight!r} must be in [0, 1]")
        if not self.distill_temperature > 0:
            raise ConfigError(f"distill_temperature={self.distill_temperature!r} must be > 0")
        if self.bpe_vocab_size < 257 and self.tokenizer == "bpe":
            raise ConfigError(f"bpe_vocab_size={self.bpe_vocab_size} must be at least 257 (256 bytes + merges)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "TrainConfig":
        return _strict(cls, data, source)


def _strict(cls, data: dict[str, Any], source: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; "
                          f"valid fields are: {', '.join(sorted(names))}")
    try:
        return cls(**data)
    except TypeError as e:  # wrong types reach here, e.g. a string where a number is needed
        raise ConfigError(f"{source}: invalid value in {cls.__name__}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


@dataclass
class RunConfig:
    """What a checkpoint folder's config.json holds: the model and, for trained models, how."""

    model: ModelConfig
    train: TrainConfig | None = None
    tokenizer: str = "byte"  # "byte" or "bpe" (then tokenizer.json sits beside the weights)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "train": self.train.to_dict() if self.train else None,
                "tokenizer": self.tokenizer, "extra": self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> "RunConfig":
        if not isinstance(data, dict) or "model" not in data:
            raise ConfigError(f"{source}: expected an object with a 'model' section (an attnlab config.json)")
        unknown = sorted(set(data) - {"model", "train", "tokenizer", "extra"})
        if unknown:
            raise ConfigError(f"{source}: unknown top-level field(s) {', '.join(unknown)}; "
                              "valid: model, train, tokenizer, extra")
        model = ModelConfig.from_dict(data["model"], f"{source} [model]")
        train = TrainConfig.from_dict(data["train"], f"{source} [train]") if data.get("train") else None
        tok = data.get("tokenizer", "byte")
        _choice("tokenizer", tok, TOKENIZERS)
        return cls(model=model, train=train, tokenizer=tok, extra=dict(data.get("extra") or {}))

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e}); fix or delete the file") from None
        return cls.from_dict(data, str(path))


# Presets: plain keyword dicts (gpt-fast style). "default" is what the README's main job trains.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=32, n_layers=2, n_heads=4, max_seq_len=256),
    "default": dict(dim=128, n_layers=4, n_heads=4, max_seq_len=1024),
    "small-10m": dict(dim=384, n_layers=6, n_heads=6, max_seq_len=1024),  # ~10.7M params at vocab 256
    "lstm-10m": dict(family="lstm", dim=800, n_layers=2),  # ~10.7M params, for like-for-like comparisons
    "gpt2": dict(vocab_size=50257, dim=768, n_layers=12, n_heads=12, max_seq_len=1024, pos="learned",
                 bias=True, norm="layernorm", mlp="gelu", tie_embeddings=True),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
