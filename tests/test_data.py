"""Tokenizers, corpora and synthetic tasks."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import TrainConfig
from attnlab.data.corpus import load_corpus
from attnlab.data.synthetic import IGNORE, copy_batch, mqar_batch
from attnlab.data.tasks import make_task
from attnlab.data.tokenizers import BPETokenizer, ByteTokenizer
from attnlab.errors import DataError


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_byte_tokenizer_is_lossless_for_any_bytes(data):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(data)) == data


def test_byte_tokenizer_keeps_invalid_utf8():
    raw = b"caf\xc3\xa9 \xff\xfe broken \xc3"
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(raw)) == raw
    assert "\ufffd" in tok.decode_text(tok.encode(raw))  # text view replaces, bytes view keeps


def test_bpe_trains_saves_and_reloads(tmp_path):
    texts = ["def add(a, b):\n    return a + b\n"] * 50 + ["class Foo:\n    pass\n"] * 50
    tok = BPETokenizer.train(texts, vocab_size=300)
    assert 256 < tok.vocab_size <= 300
    tok.save(tmp_path)
    again = BPETokenizer.load(tmp_path / "tokenizer.json")
    text = "def add(a, b):\n    return a + b\n"
    ids = tok.encode(text)
    assert ids == again.encode(text) and again.decode_text(ids) == text
    assert len(ids) < len(text.encode())  # merges actually compress


def test_bpe_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="tokenizer.json"):
        BPETokenizer.load(tmp_path)


def test_embedded_corpus_is_deterministic_and_split():
    a, b = load_corpus(max_bytes=2_000_000), load_corpus(max_bytes=2_000_000)
    assert a.train == b.train and a.val == b.val and a.fingerprint == b.fingerprint
    assert len(a.val) > 0.02 * len(a.train) and a.source.startswith("python-stdlib")
    assert b"def " in a.train


def test_user_file_and_empty_corpus(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"hello world\n" * 100)
    c = load_corpus(str(f))
    assert c.train + c.val == b"hello world\n" * 100
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty or too small"):
        load_corpus(str(tmp_path / "empty"))
    with pytest.raises(DataError, match="no such file"):
        load_corpus(str(tmp_path / "nope"))


def test_copy_targets_are_the_first_half():
    x, y = copy_batch(4, 20, 9, torch.Generator().manual_seed(1))
    n = 10
    assert torch.equal(y[:, n:], x[:, :n])  # after the separator the answer is the first half again
    assert torch.all(y[:, :n] == IGNORE) and torch.all(x[:, n] == 0)


def test_mqar_answers_are_the_keys_values():
    x, y, dist = mqar_batch(8, 64, 32, 6, torch.Generator().manual_seed(2), return_distance=True)
    for b in range(8):
        pairs = {int(x[b, 2 * i]): int(x[b, 2 * i + 1]) for i in range(6)}
        asked = (y[b] != IGNORE).nonzero().flatten()
        assert len(asked) == 6
        for t in asked.tolist():
            assert pairs[int(x[b, t])] == int(y[b, t])  # the query key's value
            assert dist[b, t] > 0
    assert x.shape == y.shape == (8, 64)


def test_synthetic_bad_settings_are_clear_errors():
    with pytest.raises(DataError, match="needs vocab"):
        mqar_batch(1, 64, 8, 6, torch.Generator())
    with pytest.raises(DataError, match="needs seq_len"):
        mqar_batch(1, 10, 64, 6, torch.Generator())


def test_task_batches_are_a_function_of_seed_and_step(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(bytes(range(256)) * 40)
    cfg = TrainConfig(data=str(f), seq_len=16, batch_size=4)
    t1, t2 = make_task(cfg), make_task(cfg)
    assert torch.equal(t1.batch(7)[0], t2.batch(7)[0])
    assert not torch.equal(t1.batch(7)[0], t1.batch(8)[0])
    x, y = t1.batch(3)
    assert torch.equal(x[:, 1:], y[:, :-1])
