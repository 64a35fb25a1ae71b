"""Checkpoint folders: round trip, atomic commit, and a clear error for every kind of damage."""
import json

import pytest
import torch

from attnlab.checkpoint import commit_files, load_checkpoint, recover, save_checkpoint
from attnlab.config import ModelConfig, RunConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.models import build_model
from conftest import FAMILIES, tiny


@pytest.mark.parametrize("kw", [dict(family=f) for f in FAMILIES]
                         + [dict(pos="learned", tie_embeddings=False), dict(pos="alibi", norm="rmsnorm"),
                            dict(qkv_bias=True, kernel="sliding", window=4)])
def test_round_trip_gives_identical_logits(tmp_path, kw):
    model = build_model(tiny(**kw)).eval()
    save_checkpoint(tmp_path, model, RunConfig(model=model.cfg))
    loaded, cfg = load_checkpoint(tmp_path)
    assert cfg.model == model.cfg
    x = torch.randint(0, 37, (2, 9))
    torch.testing.assert_close(loaded(x)[0], model(x)[0], atol=0, rtol=0)
    if model.cfg.tie_embeddings and not model.cfg.is_recurrent:
        assert loaded.head.weight is loaded.tok_emb.weight


@pytest.fixture
def ckpt(tmp_path):
    model = build_model(tiny())
    save_checkpoint(tmp_path, model, RunConfig(model=model.cfg))
    return tmp_path


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(ckpt)


def test_missing_manifest(ckpt):
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json is missing"):
        load_checkpoint(ckpt)


def test_truncated_weights(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(ckpt)


def test_corrupted_weights_fail_the_sha256(ckpt):
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # same size, one flipped byte
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted: sha256"):
        load_checkpoint(ckpt)


def test_no_such_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        load_checkpoint(tmp_path / "nothing")


def _rewrite_config(folder, edit):
    """Edit config.json and re-sign the manifest, as a user hand-editing a config would after `verify`."""
    data = json.loads((folder / "config.json").read_text())
    edit(data)
    raw = json.dumps(data).encode()
    manifest = json.loads((folder / "manifest.json").read_text())
    import hashlib
    manifest["files"]["config.json"] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    commit_files(folder, {"config.json": raw, "manifest.json": json.dumps(manifest).encode()})


def test_config_with_unknown_field(ckpt):
    _rewrite_config(ckpt, lambda d: d["model"].update(n_layer=3))
    with pytest.raises(ConfigError, match="unknown field.*n_layer.*valid fields are:.*n_layers"):
        load_checkpoint(ckpt)


def test_config_with_invalid_value(ckpt):
    _rewrite_config(ckpt, lambda d: d["model"].update(kernel="fast"))
    with pytest.raises(ConfigError, match="kernel='fast' is not known; choose one of: naive, sdpa"):
        load_checkpoint(ckpt)


def test_config_from_before_qkv_bias_still_loads(ckpt):
    _rewrite_config(ckpt, lambda d: d["model"].pop("qkv_bias"))
    model, cfg = load_checkpoint(ckpt)
    assert cfg.model.qkv_bias is False and model.backbone.blocks[0].attn.wqkv.bias is None


@pytest.mark.parametrize("family", ["linear", "ssm"])
def test_config_from_before_the_short_convolution_still_loads(tmp_path, family):
    model = build_model(tiny(family=family, short_conv=0)).eval()  # what such a model was: no convolution
    save_checkpoint(tmp_path, model, RunConfig(model=model.cfg))
    _rewrite_config(tmp_path, lambda d: d["model"].pop("short_conv"))
    loaded, cfg = load_checkpoint(tmp_path)
    x = torch.randint(0, 37, (2, 9))
    assert cfg.model.short_conv == 0
    torch.testing.assert_close(loaded(x)[0], model(x)[0], atol=0, rtol=0)


def test_ssm_config_from_before_the_gate_bias_still_loads(tmp_path):
    model = build_model(tiny(family="ssm", pos="none", ssm_gate_bias=None)).eval()  # Mamba's gate: no bias
    save_checkpoint(tmp_path, model, RunConfig(model=model.cfg))
    _rewrite_config(tmp_path, lambda d: d["model"].pop("ssm_gate_bias"))
    loaded, cfg = load_checkpoint(tmp_path)
    x = torch.randint(0, 37, (2, 9))
    assert cfg.model.ssm_gate_bias is None
    torch.testing.assert_close(loaded(x)[0], model(x)[0], atol=0, rtol=0)


def test_the_ssm_gate_starts_open_and_is_learned():
    """The init that zeroes every other bias leaves the gate's at its start (ssm.py says why it must be open)."""
    model = build_model(tiny(family="ssm", pos="none", ssm_gate_bias=1.5))
    biases = [m.gate_bias for m in model.modules() if getattr(m, "gate_bias", None) is not None]
    assert biases and all(b.requires_grad and torch.equal(b, torch.full_like(b, 1.5)) for b in biases)


def test_config_that_does_not_fit_the_weights(ckpt):
    _rewrite_config(ckpt, lambda d: d["model"].update(dim=64, head_dim=None, hidden_dim=None))
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("field,value,message", [
    ("family", "mamba", "family='mamba' is not known; choose one of: transformer, rnn, lstm, gru"),
    ("pos", "xpos", "pos='xpos' is not known; choose one of: none, sinusoidal, learned, rope, alibi"),
    ("n_kv_heads", 3, "n_kv_heads=3 must divide n_heads=4"),
    ("dim", 30, "n_heads=4 must divide dim=30"),
    ("qkv_bias", "yes", "qkv_bias='yes' must be true or false"),
    ("ssm_gate_bias", "open", "ssm_gate_bias='open' must be a number"),
])
def test_invalid_model_fields_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{field: value})


def test_commit_is_atomic_across_files(tmp_path):
    commit_files(tmp_path, {"a": b"old-a", "b": b"old-b"})
    # a writer killed after the commit point but before its renames: the reader rolls forward
    (tmp_path / ".a.tmp").write_bytes(b"new-a")
    (tmp_path / ".b.tmp").write_bytes(b"new-b")
    (tmp_path / ".commit.json").write_text(json.dumps({"files": ["a", "b"]}))
    import os
    os.replace(tmp_path / ".a.tmp", tmp_path / "a")  # one rename happened before the kill
    recover(tmp_path)
    assert (tmp_path / "a").read_bytes() == b"new-a" and (tmp_path / "b").read_bytes() == b"new-b"
    # a writer killed before the commit point: its temporaries are discarded, the old files stay
    (tmp_path / ".a.tmp").write_bytes(b"newer-a")
    recover(tmp_path)
    assert (tmp_path / "a").read_bytes() == b"new-a" and not (tmp_path / ".a.tmp").exists()
