"""Readings of a Hugging Face config.json that both the checkpoint loader (models/hf.py) and the cost model
(cost/arch.py) make, kept in one place so the two cannot read the same field two ways; plain dict in, plain values
out (no model code, no torch)."""
from __future__ import annotations

from attnlab.errors import CheckpointError


def sliding_window_from_hf(hf: dict, source: str = "config.json") -> int | None:
    """The sliding window W every layer uses (keys per query, counting itself), or None for causal attention.

    Mistral slides every layer (HF's MistralForCausalLM ignores layer_types). Qwen2 slides only with
    use_sliding_window, and then only the layers that layer_types names "sliding_attention" (by default those
    from max_window_layers on). A window of at least max_position_embeddings never hides a key: causal.
    attnlab runs one attention kind in every layer, so a mixture is refused."""
    kind, n_layers = hf.get("model_type"), hf.get("num_hidden_layers", 0)
    window = hf.get("sliding_window")
    if kind == "mistral":
        sliding = [True] * n_layers
    elif hf.get("use_sliding_window", False):  # Qwen2's switch (and its relatives' in the cost model)
        first = hf.get("max_window_layers", 28)  # Qwen2Config's default
        types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                          for i in range(n_layers)]
        if len(types) != n_layers:
            raise CheckpointError(f"{source}: layer_types lists {len(types)} layers but num_hidden_layers is "
                                  f"{n_layers}; make them agree")
        sliding = [t == "sliding_attention" for t in types]
    else:
        return None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise CheckpointError(f"{source}: sliding_window={window!r} must be a positive integer or null")
    if window is None or window >= hf.get("max_position_embeddings", float("inf")) or not any(sliding):
        return None
    if not all(sliding):
        raise CheckpointError(
            f"{source}: use_sliding_window is true but only {sum(sliding)} of {n_layers} layers slide (window "
            f"{window}; max_window_layers={hf.get('max_window_layers')} or layer_types keep the others on full "
            "attention); attnlab runs one attention kind in every layer. Make every layer slide (max_window_layers "
            "0, and every layer_types entry 'sliding_attention' if the config lists them) or set "
            f"use_sliding_window to false for full attention everywhere (identical on contexts up to {window} tokens)")
    return window
