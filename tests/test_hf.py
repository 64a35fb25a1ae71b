"""Hugging Face checkpoints: logits and greedy generations match transformers' on the same weights."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")  # test-only oracle (in the [dev] extra)
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from attnlab.engine import generate  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402
from attnlab.loading import load_any  # noqa: E402
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
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF inits norms to 1; perturb them so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


CASES = {
    "gpt2": lambda: _gpt2(),
    "gpt2-untied": lambda: _gpt2(tie=False),
    "llama-gqa": lambda: _llama(),
    "llama-tied-mha": lambda: _llama(tie=True, kv_heads=4),
    "llama-rope-linear": lambda: _llama(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama3-rope": lambda: _llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
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


def test_tokenizer_and_generation_config_are_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = _gpt2()
    hf.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)} | {"[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    loaded = load_any(tmp_path)
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
