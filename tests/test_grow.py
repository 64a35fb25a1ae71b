"""Growing a trained transformer wider keeps its function (models/grow.py)."""
import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.models import build_model
from attnlab.models.grow import grow_width


def _randomised(cfg: ModelConfig):
    """A model whose every parameter is random (biases and norm gains too), so a wrong copy rule shows."""
    torch.manual_seed(0)
    model = build_model(cfg, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False, bias=True, norm="rmsnorm", mlp="swiglu"),
                                dict(n_kv_heads=2, pos="learned", bias=True), dict(pos="none", qkv_bias=True)])
def test_grown_model_computes_the_same_logits(kw):
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=4, max_seq_len=64, **kw)
    small = _randomised(cfg)
    wide = grow_width(small, 3).eval()
    assert (wide.cfg.dim, wide.cfg.n_heads, wide.cfg.head_dim, wide.cfg.hidden_dim) == (
        96, 12, cfg.head_dim, 3 * cfg.hidden_dim)
    assert sum(p.numel() for p in wide.parameters()) > 5 * sum(p.numel() for p in small.parameters())
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(wide(x)[0], small(x)[0], atol=2e-4, rtol=2e-4)
        # decoding through the cache agrees too
        state = wide.new_state(2, 64)
        wide(x[:, :39], state)
        torch.testing.assert_close(wide(x[:, 39:], state)[0][:, -1], small(x)[0][:, -1], atol=2e-4, rtol=2e-4)


def test_noise_breaks_the_copies_apart_but_keeps_the_function_close():
    small = _randomised(ModelConfig(dim=32, n_layers=2, n_heads=4, max_seq_len=64))
    wide = grow_width(small, 2, noise=0.01).eval()
    w = wide.backbone.blocks[0].mlp.w1.weight
    assert not torch.equal(w[:128], w[128:])  # the two copies of the hidden units differ
    assert wide.head.weight is wide.tok_emb.weight  # still tied
    x = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        a, b = wide(x)[0].softmax(-1), small(x)[0].softmax(-1)
    assert float((a - b).abs().max()) < 0.1


@pytest.mark.parametrize("kw", [dict(pos="alibi"), dict(pos="sinusoidal"), dict(family="lstm")])
def test_refuses_what_it_cannot_grow(kw):
    with pytest.raises(ConfigError, match="grow"):
        grow_width(build_model(ModelConfig(dim=32, n_layers=1, n_heads=4, **kw), "cpu"), 2)
