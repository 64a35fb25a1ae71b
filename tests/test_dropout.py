"""The CPU dropout's mask (models/dropout.py): its rate, scaling, independence, gradient and seeding."""
import pytest
import torch
from torch import nn

from attnlab.models.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_drop_rate_is_p_within_sampling_error(p):
    torch.manual_seed(0)
    n = 1 << 20
    rate = 1 - keep_mask((n,), p).float().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(rate - p) < 5 * sigma + 2 ** -16, (rate, p)


def test_neighbouring_decisions_are_independent():
    """Four decisions come from one 64-bit word: their masks must not be correlated."""
    torch.manual_seed(1)
    m = keep_mask((1 << 20,), 0.3).float()
    for lag in (1, 2, 3, 4, 5):
        c = torch.corrcoef(torch.stack((m[:-lag], m[lag:])))[0, 1].item()
        assert abs(c) < 0.01, (lag, c)


def test_kept_elements_are_scaled_and_the_mean_is_kept():
    torch.manual_seed(2)
    x = torch.full((512, 512), 3.0)
    y = dropout(x, 0.25)
    kept = y != 0
    assert torch.equal(y[kept], torch.full_like(y[kept], 3.0 / 0.75))
    assert abs(y.mean().item() - 3.0) < 0.03


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.4)
    y.sum().backward()
    kept = y.detach() != 0
    assert torch.equal(x.grad, kept.float() / 0.6)


def test_eval_mode_and_zero_p_are_the_identity_and_the_mask_is_seeded():
    x = torch.randn(8, 16)
    module = Dropout(0.5)
    module.eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    module.train()
    torch.manual_seed(4)
    a = module(x)
    torch.manual_seed(4)
    assert torch.equal(a, module(x))
    assert not torch.equal(a, module(x))  # the generator moved on


def test_bad_p_is_refused_like_torch():
    with pytest.raises(ValueError, match="must be in"):
        Dropout(1.0)
    assert Dropout(0.2).extra_repr() == nn.Dropout(0.2).extra_repr().split(",")[0]
