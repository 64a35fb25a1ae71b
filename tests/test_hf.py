"""Hugging Face checkpoints: logits and greedy generations match transformers' on the same weights."""
import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")  # test-only oracle (in the [dev] extra)
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from attnlab.engine import generate  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402
from attnlab.models import build_model  # noqa: E402
from attnlab.resolve import load_model  # noqa: E402
from attnlab.models.hf import load_hf, save_hf  # noqa: E402

V = 97


def _gpt2(tie=True):
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=V, n_positions=64, tie_word_embeddings=tie,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def _llama(tie=False, rope_scaling=None, kv_heads=2):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                      intermediate_size=96, vocab_size=V, max_position_embeddings=128, rope_theta=5000.0,
                      tie_word_embeddings=tie, rope_scaling=rope_scaling, bos_token_id=0, eos_token_id=0)
    return _perturbed(LlamaForCausalLM(cfg))


def _perturbed(model):
    with torch.no_grad():  # HF inits norms to 1 and biases to 0; perturb them so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _qwen2(**sliding):
    """Qwen2.5-0.5B's shape in miniature: q/k/v biases, GQA, tied embeddings, rope_theta 1e6."""
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96, vocab_size=V, max_position_embeddings=128, rope_theta=1e6,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                      attn_implementation="eager", **sliding)
    return _perturbed(Qwen2ForCausalLM(cfg))


def _mistral(window):
    """head_dim 24 given explicitly (not dim / heads = 16), as Mistral configs may."""
    torch.manual_seed(0)
    cfg = MistralConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=24, intermediate_size=96, vocab_size=V, max_position_embeddings=128,
                        sliding_window=window, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return _perturbed(MistralForCausalLM(cfg))


CASES = {
    "gpt2": lambda: _gpt2(),
    "gpt2-untied": lambda: _gpt2(tie=False),
    "llama-gqa": lambda: _llama(),
    "llama-tied-mha": lambda: _llama(tie=True, kv_heads=4),
    "llama-rope-linear": lambda: _llama(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama3-rope": lambda: _llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "qwen2": lambda: _qwen2(),
    # Every layer slides (max_window_layers 0): the sliding kernel, as for Mistral.
    "qwen2-sliding": lambda: _qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0),
    # Window 8 < the 40-token input and the 12 + 20 tokens of the greedy run: the ring cache wraps.
    "mistral-window8": lambda: _mistral(8),
    "mistral-no-window": lambda: _mistral(None),
    "mistral-window-past-context": lambda: _mistral(128),  # never hides a key: plain causal attention
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("sharded", [False, True])
def test_logits_and_greedy_generation_match(tmp_path, name, sharded):
    hf = CASES[name]()
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    model, *_ = load_hf(tmp_path)
    x = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        ref = hf(x).logits
    out = model(x)[0]
    assert ref.std() > 0.05  # a real signal, not a degenerate all-equal output
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    prompt = x[0, :12]
    with torch.no_grad():
        hf_ids = hf.generate(prompt[None], max_new_tokens=20, min_new_tokens=20, do_sample=False,
                             pad_token_id=0)[0, 12:].tolist()
    assert generate(model, prompt.tolist(), 20).tokens == hf_ids


@pytest.mark.parametrize("name", ["gpt2", "gpt2-untied", "llama-gqa", "llama-tied-mha"])
def test_save_hf_round_trip_loads_in_transformers(tmp_path, name):
    hf = CASES[name]()
    hf.save_pretrained(tmp_path / "a")
    model, *_ = load_hf(tmp_path / "a")
    save_hf(model, tmp_path / "b", eos_token_id=0)
    back = type(hf).from_pretrained(tmp_path / "b").eval()
    x = torch.randint(0, V, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, hf(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,kernel,window", [("mistral-window8", "sliding", 8), ("qwen2-sliding", "sliding", 8),
                                                 ("mistral-no-window", "sdpa", None),
                                                 ("mistral-window-past-context", "sdpa", None)])
def test_sliding_window_maps_to_the_same_window(tmp_path, name, kernel, window):
    """HF's query i sees keys i-W < j <= i (masking_utils.sliding_window_overlay): attnlab's window W exactly,
    and one key fewer or more changes the logits."""
    hf = CASES[name]()
    hf.save_pretrained(tmp_path)
    model, cfg, *_ = load_hf(tmp_path)
    assert cfg.kernel == kernel and (window is None or cfg.window == window)
    if window is None:
        return
    x = torch.randint(0, V, (1, 40))
    with torch.no_grad():
        ref = hf(x).logits
        for off_by_one in (window - 1, window + 1):
            other = build_model(dataclasses.replace(cfg, window=off_by_one)).eval()
            other.load_state_dict(model.state_dict())
            assert (other(x)[0] - ref).abs().max() > 1e-2


def test_qwen2_biases_are_on_qkv_only(tmp_path):
    _qwen2().save_pretrained(tmp_path)
    model, cfg, *_ = load_hf(tmp_path)
    attn, mlp = model.backbone.blocks[0].attn, model.backbone.blocks[0].mlp
    assert cfg.qkv_bias and not cfg.bias and cfg.tie_embeddings and cfg.rope_theta == 1e6 and cfg.norm_eps == 1e-5
    assert attn.wqkv.bias is not None and attn.wo.bias is None and mlp.w1.bias is None
    assert model.head.weight is model.tok_emb.weight


def test_qwen2_with_some_layers_sliding_is_refused(tmp_path):
    _qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=1).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"only 1 of 2 layers slide \(window 8; max_window_layers=1.*"
                                              r"one attention kind in every layer. Make every layer slide"):
        load_hf(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["use_sliding_window"] = False  # the fix the message offers
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_hf(tmp_path)[1].kernel == "sdpa"


@pytest.mark.parametrize("name", ["qwen2", "qwen2-sliding", "mistral-window8", "llama-gqa", "gpt2"])
def test_cost_model_reads_the_same_architecture(tmp_path, name):
    from attnlab.cost.analytic import params
    from attnlab.cost.arch import from_hf_config, from_model_config
    from attnlab.models import count_params

    CASES[name]().save_pretrained(tmp_path)
    model, cfg, hf_cfg, _ = load_hf(tmp_path)
    arch = from_hf_config(hf_cfg)
    assert params(arch)["total"] == params(from_model_config(cfg))["total"] == count_params(model)
    assert arch.sliding_window == (cfg.window if cfg.kernel == "sliding" else None)


def test_save_hf_refuses_what_its_layouts_cannot_hold(tmp_path):
    _mistral(8).save_pretrained(tmp_path / "a")
    with pytest.raises(CheckpointError, match="kernel='sliding'.*no GPT-2 or Llama equivalent"):
        save_hf(load_hf(tmp_path / "a")[0], tmp_path / "b")


def test_tokenizer_and_generation_config_are_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = _gpt2()
    hf.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)} | {"[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    loaded = load_model(tmp_path)
    assert loaded.kind == "hf" and loaded.stop_tokens == [5]
    assert loaded.tokenizer.encode("w3 w4") == [3, 4]


def _saved(tmp_path, hf=None):
    (hf or _gpt2()).save_pretrained(tmp_path)
    return tmp_path


def _edit_weights(folder, fn):
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    folder = _saved(tmp_path)
    _edit_weights(folder, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(CheckpointError, match="'h.1.mlp.c_fc.weight' is missing"):
        load_hf(folder)


def test_unexpected_tensor(tmp_path):
    folder = _saved(tmp_path)
    _edit_weights(folder, lambda t: t.update({"transformer.h.9.extra": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected tensors.*h.9.extra"):
        load_hf(folder)


def test_shape_mismatch(tmp_path):
    folder = _saved(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_inner"] = 128
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_hf(folder)


def test_missing_shard(tmp_path):
    _llama().save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shard.*{shard.name}.*missing"):
        load_hf(tmp_path)


def test_unsupported_architecture(tmp_path):
    folder = _saved(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "bert"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="model_type 'bert' is not supported; supported: gpt2, llama"):
        load_hf(folder)


def test_pickle_only_folder_is_refused(tmp_path):
    folder = _saved(tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors only"):
        load_hf(folder)
