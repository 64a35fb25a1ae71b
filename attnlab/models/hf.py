"""Hugging Face checkpoints: load GPT-2, Llama, Mistral and Qwen2 folders into attnlab's Transformer, save back.

A folder holds config.json, model.safetensors (or shards + model.safetensors.index.json),
tokenizer.json and optionally generation_config.json. Only safetensors are read (never pickles).
Mapping (attnlab <- HF):
- GPT-2: Conv1D weights are stored (in, out) and transposed; c_attn is already q|k|v fused.
- Llama, Mistral, Qwen2 (one tensor layout): q_proj|k_proj|v_proj are concatenated into wqkv;
  gate/up/down -> w1/w3/w2. HF uses the rotate-half RoPE layout, which is attnlab's, so no permutation.
- Qwen2 has biases on q/k/v only: they become wqkv's bias (``qkv_bias``); o_proj and the MLP have none.
- A sliding window (Mistral; Qwen2 with use_sliding_window) becomes the ``sliding`` kernel with the same
  window: HF's query i sees keys j with i - W < j <= i (masking_utils.sliding_window_overlay), W keys
  counting itself, which is attnlab's ``window`` (attention.build_mask). A window of at least
  max_position_embeddings never hides a key, so it loads as plain causal attention.
Saving writes the GPT-2 or Llama layout only.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError
from attnlab.hf_config import sliding_window_from_hf

SUPPORTED = ("gpt2", "llama", "mistral", "qwen2")


def is_hf_folder(folder: str | Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.exists():
        return False
    try:
        return "model_type" in json.loads(cfg.read_text())
    except json.JSONDecodeError:
        return False


def _need(hf: dict, key: str, source: str):
    if key not in hf:
        raise CheckpointError(f"{source}: config.json lacks {key!r}, which a {hf.get('model_type')} model needs")
    return hf[key]


def config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    kind = hf.get("model_type")
    if kind == "gpt2":
        if hf.get("scale_attn_by_inverse_layer_idx"):
            raise CheckpointError(f"{source}: GPT-2 with scale_attn_by_inverse_layer_idx is not supported")
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise CheckpointError(f"{source}: GPT-2 activation {act!r} is not supported (gelu_new only)")
        dim = _need(hf, "n_embd", source)
        return ModelConfig(vocab_size=_need(hf, "vocab_size", source), dim=dim, n_layers=_need(hf, "n_layer", source),
                           n_heads=_need(hf, "n_head", source), hidden_dim=hf.get("n_inner") or 4 * dim, mlp="gelu",
                           norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), pos="learned",
                           max_seq_len=_need(hf, "n_positions", source), bias=True,
                           tie_embeddings=hf.get("tie_word_embeddings", True))
    if kind in ("llama", "mistral", "qwen2"):
        if hf.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: activation {hf['hidden_act']!r} is not supported (silu only)")
        bias, qkv_bias = _biases_from_hf(hf, source)
        window = sliding_window_from_hf(hf, source)
        rope = dict(hf.get("rope_parameters") or {})
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        dim = _need(hf, "hidden_size", source)
        heads = _need(hf, "num_attention_heads", source)
        max_len = _need(hf, "max_position_embeddings", source)
        return ModelConfig(vocab_size=_need(hf, "vocab_size", source), dim=dim,
                           n_layers=_need(hf, "num_hidden_layers", source), n_heads=heads,
                           n_kv_heads=hf.get("num_key_value_heads") or heads,
                           head_dim=hf.get("head_dim") or dim // heads,
                           hidden_dim=_need(hf, "intermediate_size", source), mlp="swiglu", norm="rmsnorm",
                           norm_eps=hf.get("rms_norm_eps", 1e-6), pos="rope", rope_theta=float(theta),
                           rope_scaling=_scaling_from_hf(scaling, max_len, source), max_seq_len=max_len,
                           bias=bias, qkv_bias=qkv_bias, tie_embeddings=hf.get("tie_word_embeddings", False),
                           **({"kernel": "sliding", "window": window} if window else {}))
    raise CheckpointError(f"{source}: model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")


def _biases_from_hf(hf: dict, source: str) -> tuple[bool, bool]:
    """-> (bias on every linear, bias on q/k/v only), as HF's modeling files build them."""
    kind = hf["model_type"]
    if kind == "qwen2":  # Qwen2Attention: q/k/v with bias=True, o_proj and the MLP without, whatever the config
        return False, True
    if kind == "mistral":  # MistralAttention and MistralMLP: bias=False throughout
        return False, False
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        raise CheckpointError(f"{source}: attention_bias and mlp_bias must agree (attnlab's `bias` covers both)")
    return bool(hf.get("attention_bias", False)), False


def _scaling_from_hf(scaling: dict | None, max_len: int, source: str) -> dict | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in ("linear", "dynamic", "llama3"):
        raise CheckpointError(f"{source}: rope scaling {kind!r} is not supported; supported: linear, dynamic, llama3")
    out = {"type": kind, "factor": float(scaling["factor"])}
    if kind == "dynamic":
        out["original_max_position_embeddings"] = int(scaling.get("original_max_position_embeddings", max_len))
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            out[key] = scaling[key]
    return out


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    try:
        if single.exists():
            return load_file(str(single))
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            missing = [s for s in shards if not (folder / s).exists()]
            if missing:
                raise CheckpointError(f"{folder}: shard(s) {', '.join(missing)} listed in {index.name} are missing")
            tensors = {}
            for shard in shards:
                tensors.update(load_file(str(folder / shard)))
            return tensors
    except SafetensorError as e:
        raise CheckpointError(f"{folder}: unreadable safetensors file ({e})") from None
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise CheckpointError(f"{folder}: only pickle weights (.bin/.pt) found; attnlab reads safetensors only. "
                              "Convert with transformers: model.save_pretrained(dir, safe_serialization=True)")
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


def _gpt2_names(cfg: ModelConfig):
    """(attnlab name, HF name, transpose?) for every tensor."""
    out = [("tok_emb.weight", "wte.weight", False), ("pos_enc.table.weight", "wpe.weight", False),
           ("backbone.norm.weight", "ln_f.weight", False), ("backbone.norm.bias", "ln_f.bias", False)]
    for i in range(cfg.n_layers):
        a, h = f"backbone.blocks.{i}.", f"h.{i}."
        out += [(a + "attn_norm.weight", h + "ln_1.weight", False), (a + "attn_norm.bias", h + "ln_1.bias", False),
                (a + "attn.wqkv.weight", h + "attn.c_attn.weight", True), (a + "attn.wqkv.bias", h + "attn.c_attn.bias", False),
                (a + "attn.wo.weight", h + "attn.c_proj.weight", True), (a + "attn.wo.bias", h + "attn.c_proj.bias", False),
                (a + "mlp_norm.weight", h + "ln_2.weight", False), (a + "mlp_norm.bias", h + "ln_2.bias", False),
                (a + "mlp.w1.weight", h + "mlp.c_fc.weight", True), (a + "mlp.w1.bias", h + "mlp.c_fc.bias", False),
                (a + "mlp.w2.weight", h + "mlp.c_proj.weight", True), (a + "mlp.w2.bias", h + "mlp.c_proj.bias", False)]
    return out


def _llama_names(cfg: ModelConfig):
    out = [("tok_emb.weight", "model.embed_tokens.weight"), ("backbone.norm.weight", "model.norm.weight")]
    for i in range(cfg.n_layers):
        a, h = f"backbone.blocks.{i}.", f"model.layers.{i}."
        out += [(a + "attn_norm.weight", h + "input_layernorm.weight"),
                (a + "mlp_norm.weight", h + "post_attention_layernorm.weight"),
                (a + "attn.wo.weight", h + "self_attn.o_proj.weight"), (a + "mlp.w1.weight", h + "mlp.gate_proj.weight"),
                (a + "mlp.w3.weight", h + "mlp.up_proj.weight"), (a + "mlp.w2.weight", h + "mlp.down_proj.weight")]
        if cfg.bias:
            out += [(a + "attn.wo.bias", h + "self_attn.o_proj.bias"), (a + "mlp.w1.bias", h + "mlp.gate_proj.bias"),
                    (a + "mlp.w3.bias", h + "mlp.up_proj.bias"), (a + "mlp.w2.bias", h + "mlp.down_proj.bias")]
    return out


def state_from_hf(kind: str, cfg: ModelConfig, hf: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    hf = dict(hf)
    used, out = set(), {}

    def take(name):
        if name not in hf:
            raise CheckpointError(f"{source}: tensor {name!r} is missing from the weights")
        used.add(name)
        return hf[name]

    if kind == "gpt2":
        hf = {k.removeprefix("transformer."): v for k, v in hf.items()}
        for ours, theirs, transpose in _gpt2_names(cfg):
            out[ours] = _t(take(theirs)) if transpose else take(theirs)
        if "lm_head.weight" in hf:
            used.add("lm_head.weight")
            if not cfg.tie_embeddings:
                out["head.weight"] = hf["lm_head.weight"]
    else:
        for ours, theirs in _llama_names(cfg):
            out[ours] = take(theirs)
        for i in range(cfg.n_layers):
            h = f"model.layers.{i}.self_attn."
            out[f"backbone.blocks.{i}.attn.wqkv.weight"] = torch.cat([take(h + f"{p}_proj.weight") for p in "qkv"])
            if cfg.bias or cfg.qkv_bias:
                out[f"backbone.blocks.{i}.attn.wqkv.bias"] = torch.cat([take(h + f"{p}_proj.bias") for p in "qkv"])
        if not cfg.tie_embeddings:
            out["head.weight"] = take("lm_head.weight")
        elif "lm_head.weight" in hf:
            used.add("lm_head.weight")
    extra = sorted(k for k in set(hf) - used if not k.endswith(("attn.bias", "attn.masked_bias", "rotary_emb.inv_freq")))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:5]}{' …' if len(extra) > 5 else ''}; "
                              "the folder does not match its config.json")
    return out


def load_hf(folder: str | Path, dtype: torch.dtype | None = None, device="cpu"):
    """-> (model in eval mode, ModelConfig, hf config dict, generation config dict)."""
    from attnlab.models import build_model
    from attnlab.models.weights import load_weights

    folder = Path(folder)
    hf_cfg = json.loads((folder / "config.json").read_text())
    cfg = config_from_hf(hf_cfg, str(folder / "config.json"))
    tensors = state_from_hf(hf_cfg["model_type"] if hf_cfg["model_type"] == "gpt2" else "llama", cfg,
                            read_safetensors(folder), str(folder))
    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    load_weights(model, {k: v.float() if dtype is None else v.to(dtype) for k, v in tensors.items()}, str(folder))
    model.rebuild_buffers()
    model = model.to(device)
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    return model.eval(), cfg, hf_cfg, gen


def hf_stop_tokens(hf_cfg: dict, gen: dict) -> list[int]:
    eos = gen.get("eos_token_id", hf_cfg.get("eos_token_id"))
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [int(eos)]


def save_hf(model, folder: str | Path, architecture: str | None = None, tokenizer=None, eos_token_id=None) -> None:
    """Write an attnlab Transformer as a Hugging Face folder (gpt2 or llama layout, chosen from the config)."""
    cfg = model.cfg
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kind = architecture or ("gpt2" if cfg.pos == "learned" and cfg.mlp == "gelu" else "llama")
    if kind not in ("gpt2", "llama"):
        raise CheckpointError(f"save_hf writes the gpt2 or llama layout, not {kind!r}; pass one of those")
    if cfg.kernel in ("sliding", "block_sparse") or (cfg.qkv_bias and not cfg.bias):
        # Neither layout can say "sliding window" or "bias on q/k/v only": the folder would load as another model.
        raise CheckpointError(f"save_hf: kernel={cfg.kernel!r}, qkv_bias={cfg.qkv_bias} has no GPT-2 or Llama "
                              "equivalent (Mistral and Qwen2 folders load but are not written back); "
                              "save it with attnlab.checkpoint.save_checkpoint instead")
    sd = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    tensors = {}
    if kind == "gpt2":
        if not (cfg.pos == "learned" and cfg.mlp == "gelu" and cfg.norm == "layernorm" and cfg.bias
                and cfg.n_kv_heads == cfg.n_heads and cfg.head_dim * cfg.n_heads == cfg.dim):
            raise CheckpointError("only a learned-position, GELU, LayerNorm, biased, non-GQA model fits GPT-2's layout")
        for ours, theirs, transpose in _gpt2_names(cfg):
            tensors["transformer." + theirs] = _t(sd[ours]) if transpose else sd[ours]
        hf_cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
                  "n_embd": cfg.dim, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_positions": cfg.max_seq_len,
                  "n_inner": cfg.hidden_dim, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
                  "tie_word_embeddings": cfg.tie_embeddings}
        if not cfg.tie_embeddings:
            tensors["lm_head.weight"] = sd["head.weight"]
    else:
        if not (cfg.pos == "rope" and cfg.mlp == "swiglu" and cfg.norm == "rmsnorm"):
            raise CheckpointError("only a RoPE, SwiGLU, RMSNorm model fits Llama's layout")
        for ours, theirs in _llama_names(cfg):
            tensors[theirs] = sd[ours]
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        for i in range(cfg.n_layers):
            h = f"model.layers.{i}.self_attn."
            for p, part in zip("qkv", sd[f"backbone.blocks.{i}.attn.wqkv.weight"].split((q, kv, kv))):
                tensors[h + f"{p}_proj.weight"] = part.contiguous()
            if cfg.bias:
                for p, part in zip("qkv", sd[f"backbone.blocks.{i}.attn.wqkv.bias"].split((q, kv, kv))):
                    tensors[h + f"{p}_proj.bias"] = part.contiguous()
        if not cfg.tie_embeddings:
            tensors["lm_head.weight"] = sd["head.weight"]
        hf_cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
                  "hidden_size": cfg.dim, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                  "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
                  "intermediate_size": cfg.hidden_dim, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
                  "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta,
                  "rope_scaling": _scaling_to_hf(cfg.rope_scaling), "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
                  "tie_word_embeddings": cfg.tie_embeddings}
    if eos_token_id is not None:
        hf_cfg["eos_token_id"] = eos_token_id
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    gen = {"eos_token_id": eos_token_id} if eos_token_id is not None else {}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer is not None and getattr(tokenizer, "name", "") == "bpe":
        tokenizer.save(folder)


def _scaling_to_hf(scaling: dict | None) -> dict | None:
    if not scaling:
        return None
    out = {k: v for k, v in scaling.items() if k != "type"}
    out["rope_type"] = scaling["type"]
    return out
