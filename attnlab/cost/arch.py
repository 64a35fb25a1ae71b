"""Architectures the cost model describes: attnlab configs, Hugging Face config.json files, and the published
architectures (``PUBLISHED``) a user may name. attnlab/resolve.py turns a name or a path into one.

``Arch`` holds only what cost depends on, including details attnlab's own model does not implement
(separate biases on the output projection and on the MLP), so real model cards can be priced exactly.
A Hugging Face config's sliding window is read as the loader reads it (models/hf.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from attnlab.errors import ConfigError


@dataclass
class Arch:
    name: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    mlp: str = "swiglu"  # gelu | swiglu
    norm: str = "rmsnorm"  # layernorm | rmsnorm
    pos: str = "rope"  # learned adds a table of max_seq_len x dim parameters
    max_seq_len: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    sliding_window: int | None = None
    block_size: int | None = None  # block_sparse attention's block (local + strided pattern)
    family: str = "transformer"  # transformer | rnn | lstm | gru | linear | ssm
    chunk_size: int = 64  # linear attention's chunk
    ssm_state: int = 16
    ssm_expand: int = 2
    scan: str = "parallel"
    short_conv: int = 0  # linear / ssm: width of the causal depthwise convolution before the mixer
    ssm_gate_bias: bool = False  # ssm: a learned bias on the output gate (E parameters a layer)

    def __post_init__(self) -> None:
        for field in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "max_seq_len"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"{self.name}: {field}={getattr(self, field)} must be > 0")
        if self.family == "transformer" and self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.name}: n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


def from_model_config(cfg, name: str = "attnlab") -> Arch:
    """An attnlab ModelConfig (`bias` covers every linear and norm, `qkv_bias` the q/k/v projection)."""
    return Arch(name=name, vocab_size=cfg.vocab_size, dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_dim=cfg.hidden_dim, mlp=cfg.mlp,
                norm=cfg.norm, pos=cfg.pos, max_seq_len=cfg.max_seq_len, tie_embeddings=cfg.tie_embeddings,
                qkv_bias=cfg.bias or cfg.qkv_bias, out_bias=cfg.bias, mlp_bias=cfg.bias,
                norm_bias=cfg.bias and cfg.norm == "layernorm",
                family=cfg.family, sliding_window=cfg.window if cfg.kernel == "sliding" else None,
                block_size=cfg.block_size if cfg.kernel == "block_sparse" else None, chunk_size=cfg.chunk_size,
                ssm_state=cfg.ssm_state, ssm_expand=cfg.ssm_expand, scan=cfg.scan,
                short_conv=cfg.short_conv if cfg.family in ("linear", "ssm") else 0,
                ssm_gate_bias=cfg.family == "ssm" and cfg.ssm_gate_bias is not None)


_HF_NEEDS = {"gpt2": ("vocab_size", "n_embd", "n_layer", "n_head"),
             "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}


def from_hf_config(hf: dict, name: str = "hf") -> Arch:
    """A Hugging Face config.json (gpt2, llama, mistral, qwen2 and other Llama-shaped model types)."""
    kind = hf.get("model_type")
    needs = _HF_NEEDS["gpt2" if kind == "gpt2" else "llama"]
    missing = [k for k in needs if k not in hf]
    if missing:
        raise ConfigError(f"{name}: config.json lacks {', '.join(missing)} (model_type {kind!r}); "
                          "is this a complete Hugging Face config?")
    if kind == "gpt2":
        d = hf["n_embd"]
        return Arch(name=name, vocab_size=hf["vocab_size"], dim=d, n_layers=hf["n_layer"], n_heads=hf["n_head"],
                    n_kv_heads=hf["n_head"], head_dim=d // hf["n_head"], hidden_dim=hf.get("n_inner") or 4 * d,
                    mlp="gelu", norm="layernorm", pos="learned", max_seq_len=hf.get("n_positions", 1024),
                    tie_embeddings=hf.get("tie_word_embeddings", True), qkv_bias=True, out_bias=True, mlp_bias=True,
                    norm_bias=True)
    from attnlab.hf_config import sliding_window_from_hf  # the loader's reading of the window, shared

    d, h = hf["hidden_size"], hf["num_attention_heads"]
    # Qwen2 has q/k/v biases and no others, Mistral none, whatever attention_bias says (HF's modeling files)
    attention_bias = {"qwen2": False, "mistral": False}.get(kind, hf.get("attention_bias", False))
    mlp_bias = {"qwen2": False, "mistral": False}.get(kind, hf.get("mlp_bias", False))
    return Arch(name=name, vocab_size=hf["vocab_size"], dim=d, n_layers=hf["num_hidden_layers"], n_heads=h,
                n_kv_heads=hf.get("num_key_value_heads") or h, head_dim=hf.get("head_dim") or d // h,
                hidden_dim=hf["intermediate_size"], mlp="swiglu", norm="rmsnorm", pos="rope",
                max_seq_len=hf.get("max_position_embeddings", 4096),
                tie_embeddings=hf.get("tie_word_embeddings", False), qkv_bias=kind == "qwen2" or bool(attention_bias),
                out_bias=bool(attention_bias), mlp_bias=bool(mlp_bias), sliding_window=sliding_window_from_hf(hf, name))


def _gpt2(name, d, L, h):
    return dict(model_type="gpt2", vocab_size=50257, n_embd=d, n_layer=L, n_head=h, n_positions=1024)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

# Published config.json values (Hugging Face model cards), stored as plain data: shapes only, no weights.
PUBLISHED: dict[str, dict] = {
    "gpt2": _gpt2("gpt2", 768, 12, 12),
    "gpt2-medium": _gpt2("gpt2-medium", 1024, 24, 16),
    "gpt2-large": _gpt2("gpt2-large", 1280, 36, 20),
    "gpt2-xl": _gpt2("gpt2-xl", 1600, 48, 25),
    "llama-2-7b": dict(model_type="llama", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008,
                       max_position_embeddings=4096),
    "llama-3-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                       max_position_embeddings=8192, rope_theta=500000.0),
    "llama-3-70b": dict(model_type="llama", vocab_size=128256, hidden_size=8192, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                        max_position_embeddings=8192, rope_theta=500000.0),
    # Llama 3.1: 128k context through llama3 rope scaling (meta-llama/Llama-3.1-*/config.json)
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                         max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "llama-3.1-70b": dict(model_type="llama", vocab_size=128256, hidden_size=8192, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                          max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "llama-3.1-405b": dict(model_type="llama", vocab_size=128256, hidden_size=16384, num_hidden_layers=126,
                           num_attention_heads=128, num_key_value_heads=8, intermediate_size=53248,
                           max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "mistral-7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                       max_position_embeddings=32768, sliding_window=4096),
    "qwen2.5-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                       max_position_embeddings=131072, tie_word_embeddings=False, use_sliding_window=False),
    # Qwen/Qwen2.5-72B(-Instruct)/config.json: 32k native positions (131k with YaRN, as its card describes)
    "qwen2.5-72b": dict(model_type="qwen2", vocab_size=152064, hidden_size=8192, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, intermediate_size=29568,
                        max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False,
                        use_sliding_window=False),
}
