"""The needle-in-a-haystack probes of claims 14-16 (experiments/needle.py): facts of one form planted in real text,
distractors from the needle's own distribution, the needle where it was asked, answers scored exactly; and the models'
training (experiments/needle_training.py): its curriculum, its batch streams, restarts, one model per repetition."""
import re
from collections import Counter

import pytest
import torch

from attnlab.data.synthetic import IGNORE
from attnlab.errors import DataError
from attnlab.experiments import needle, needle_training

FACT = re.compile(rb"^code_([a-z]{2}) = (\d{4})$", re.M)
TEXT = b"".join(f"    line {i} of some python text = {i * 7}\n".encode() for i in range(4000))


def _batch(n=32, length=256, facts=5, depth=None, seed=0, asked=1):
    return needle.needle_batch(TEXT, n, length, facts, torch.Generator().manual_seed(seed), depth, asked)


def test_probes_have_the_asked_length_facts_and_answer():
    x, y, infos = _batch()
    assert x.shape == y.shape == (32, 256)
    for b, info in enumerate(infos):
        seq = bytes(x[b].tolist()) + bytes([int(y[b, -1])])
        found = FACT.findall(seq[:-len(needle.query_line("code_aa")) - needle.DIGITS])  # the context only
        assert len(found) == 5 and len({k for k, _ in found}) == 5  # distinct keys
        key, value = info["facts"][0]
        assert seq.endswith(f"\n{key} = {value}".encode())  # the query asks the needle, the answer follows
        a, e = info["needle"]
        assert seq[a:e] == f"{key} = {value}\n".encode()
        assert [seq[a:e] for a, e in info["distractors"]] == [f"{k} = {v}\n".encode() for k, v in info["facts"][1:]]
        assert a == 0 or seq[a - 1:a] == b"\n"  # facts sit at line starts
        answer = [int(t) for t in y[b] if int(t) != IGNORE]
        assert bytes(answer) == value.encode() and (y[b, :-needle.DIGITS] == IGNORE).all()


def test_distractors_have_the_needles_form_and_distribution():
    _, _, infos = _batch(n=400, facts=4)
    needles = [i["facts"][0] for i in infos]
    others = [f for i in infos for f in i["facts"][1:]]
    for group in (needles, others):
        digits = Counter("".join(v for _, v in group))
        letters = Counter("".join(k[len(needle.KEY_PREFIX):] for k, _ in group))
        assert set(digits) == set("0123456789") and max(digits.values()) / min(digits.values()) < 1.6
        assert len(letters) == 26
    assert all(len(k) == len(needles[0][0]) and len(v) == needle.DIGITS for k, v in needles + others)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_lands_at_the_asked_depth(depth):
    _, _, infos = _batch(n=16, length=512, depth=depth)
    for info in infos:
        assert abs(info["depth"] - depth) < 0.1, info["depth"]
    if depth == 1.0:  # next to the question: nothing but the query after it
        assert all(i["needle"][1] == 512 + 1 - len(needle.query_line("code_aa")) - needle.DIGITS for i in infos)


def test_training_sequences_ask_several_facts_the_needle_first():
    x, y, infos = _batch(n=8, length=200, facts=4, asked=3)
    for b, info in enumerate(infos):
        labelled = (y[b] != IGNORE).nonzero().flatten().tolist()
        assert len(labelled) == 3 * needle.DIGITS and labelled[-1] == 199
        answers = bytes(int(y[b, t]) for t in labelled)
        values = {v for _, v in info["facts"]}
        chunks = [answers[i:i + needle.DIGITS].decode() for i in range(0, len(answers), needle.DIGITS)]
        assert chunks[0] == info["facts"][0][1] and len(set(chunks)) == 3 and set(chunks) <= values
        for t in labelled:  # every labelled position predicts a digit that follows "key = " or a digit
            assert chr(int(x[b, t])) in " 0123456789"


def test_too_short_a_probe_is_a_clear_error():
    with pytest.raises(DataError, match="needs length"):
        _batch(length=needle.min_length(5) - 1)
    x, _, infos = _batch(length=needle.min_length(1), facts=1)  # the fact alone: no haystack at all
    assert all(i["needle"][0] == 0 for i in infos)


class _Oracle(torch.nn.Module):
    """Reads the needle's value off the input and predicts it: teacher-forced, each answer digit from the fact."""

    def __init__(self, infos, wrong_digit_at=None):
        super().__init__()
        self.infos, self.wrong = infos, wrong_digit_at

    def forward(self, x, state=None):
        B, T = x.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            value = self.infos[self.offset + b]["facts"][0][1].encode()
            for j, c in enumerate(value):
                c = c if self.wrong is None or b % 2 or j != self.wrong else (c - 47) % 10 + 48
                logits[b, T - needle.DIGITS + j, c] = 1.0
        self.offset += B
        return logits, None


def test_answers_are_scored_on_the_first_digit_and_exactly(monkeypatch):
    x, y, infos = _batch(n=8, length=128, seed=3)
    monkeypatch.setattr(needle, "needle_batch", lambda *a, **k: (x, y, infos))
    # a wrong digit in every other probe: the first digit is the retrieval step ("acc"); any digit fails "exact"
    for wrong, first, exact in ((None, 1.0, 1.0), (3, 1.0, 0.5), (0, 0.5, 0.5)):
        oracle = _Oracle(infos, wrong)
        oracle.offset = 0
        p = needle.probe(oracle, TEXT, 8, 128, 5, 0, "cpu")
        assert (p["acc"], p["exact"]) == (first, exact)


def test_training_starts_dense_then_mixes_dense_facts_in_text_and_plain_text():
    """Phase 1 only dense sequences (every fact asked); phase 2: odd steps dense, even steps plain corpus text or facts
    planted in text with at most max_asked questions (needle_training._batches)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from attnlab.data.synthetic import IGNORE
    s = replace(needle_training.SETUPS["quick"], batch=3)
    task = SimpleNamespace(cfg=SimpleNamespace(seed=0), batch=lambda step: "corpus window")
    batch = needle_training._batches(task, TEXT, s)
    asked = lambda y: {int(n) for n in (y != IGNORE).sum(-1) // needle.DIGITS}
    dense_len = needle.min_length(needle_training.DENSE_FACTS, needle_training.DENSE_FACTS)
    for step in range(6):
        x, y = batch(step, 1)
        assert asked(y) == {needle_training.DENSE_FACTS}
        assert dense_len <= x.shape[1] <= dense_len + needle_training.DENSE_SLACK
    for step in range(6, 40):
        out = batch(step)
        if step % 2:
            assert asked(out[1]) == {needle_training.DENSE_FACTS}
        elif step % 4 == 0:
            assert out == "corpus window"
        else:
            assert asked(out[1]) <= set(range(1, s.max_asked + 1)) and out[0].shape[1] <= s.train_len


def test_beyond_and_standard_errors():
    assert needle.beyond(0.30, 0.10, 0.05) is True
    assert needle.beyond(0.02, 0.10, 0.02) is False
    assert needle.beyond(0.12, 0.10, 0.05) is None
    assert needle.acc_se({"acc": 1.0, "n": 100}) > 0  # a perfect score still has an error bar


@pytest.mark.slow
def test_tiny_models_train_one_per_repetition_and_probe(monkeypatch):
    """One model per repetition, each from its own seed (initial weights and batches), trained once and shared; a
    repetition past the last model is an error, not a second look at a model."""
    from dataclasses import replace
    quick = replace(needle_training.SETUPS["quick"], steps=2, dense_steps=2, dim=32, max_facts=2, max_asked=1,
                    repeats=2, attempts=2)
    monkeypatch.setitem(needle_training.SETUPS, "quick", quick)
    monkeypatch.setattr(needle_training, "_CACHE", {})
    t = needle_training.trained("quick", "cpu")
    assert needle_training.trained("quick", "cpu") is t  # trained once, shared
    assert needle_training.training_tasks("quick", "cpu") == {}  # the report's training stage has nothing left to do
    assert [m["seed"] for m in t["models"]] == [0, 1]
    # two steps leave no model off the plateau: each seed tried a second initialisation of its own, then went on
    for m in t["models"]:
        tried = m["dense_phase"]["attempts"]
        assert [a["init"] for a in tried] == [m["seed"], m["seed"] + needle_training.RESTART_STRIDE]
        assert not any(a["learned"] for a in tried) and m["dense_phase"]["init"] == tried[-1]["init"]
    w0, w1 = (dict(m["model"].named_parameters())["tok_emb.weight"] for m in t["models"])
    assert not torch.equal(w0, w1)  # independent trainings, not one model twice
    assert [needle_training.for_repetition(t, r)["seed"] for r in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="repetition 3 has no model"):
        needle_training.for_repetition(t, 2)
    m = needle_training.for_repetition(t, 1)
    assert m["model"] is t["models"][1]["model"] and m["text"] is t["text"]
    p = needle.probe(m["model"], m["text"], 4, 128, 3, 0, "cpu", weight_n=2)
    assert len(p["weight"]) == 2 and len(p["weight"][0]) == 4 and 0 <= p["weight"][0][0] <= 1
    assert 0 <= p["acc"] <= 1 and p["tokens"] == 128
    line = needle_training.models_line(needle_training.summary("quick", "cpu"), 128)
    assert "seed 0" in line and "seed 1" in line


def test_no_two_seeds_attempts_or_phases_share_a_batch_stream():
    """Corpus windows (the task's own stream), dense and mixed batches of every (seed, attempt) come from streams of
    their own; seed 0's first attempt keeps the streams 0, 1, 2 it always had."""
    from types import SimpleNamespace

    seen = {}
    for seed in range(3):
        for attempt in range(3):
            init = seed + needle_training.RESTART_STRIDE * attempt
            full = needle_training.SETUPS["full"]
            cfg_seed = needle_training._train_config(full, needle_training.STREAMS * init).seed
            for phase in range(3):  # 0: the task's corpus windows (step_generator(cfg.seed, step)); 1, 2: _batches
                stream = cfg_seed + phase
                assert stream not in seen, (seed, attempt, phase, seen.get(stream))
                seen[stream] = (seed, attempt, phase)
    assert [s for s, who in seen.items() if who[:2] == (0, 0)] == [0, 1, 2]
    # _batches reads the config's seed: two seeds' first dense batches differ
    task = lambda seed: SimpleNamespace(cfg=SimpleNamespace(seed=needle_training.STREAMS * seed), batch=lambda _: None)
    make = lambda seed: needle_training._batches(task(seed), TEXT, needle_training.SETUPS["quick"])
    assert not torch.equal(make(0)(1, 1)[0], make(1)(1, 1)[0])


@pytest.mark.parametrize("accs,runs,tried", [
    # on the plateau at plateau_steps: the first attempt stops there; the last runs its whole schedule
    ([0.3] * 8 + [0.3] * 8, [(8, 4), (8, 8)], [(1, 4, False), (101, 8, False)]),
    # climbing past LEAVING at plateau_steps: the attempt runs on, and learns
    ([0.3, 0.4, 0.5, 0.7, 0.8, 0.95], [(8, 6)], [(1, 6, True)]),
    # climbing past LEAVING, but not learned by dense_steps: it starts again too
    ([0.3, 0.4, 0.5, 0.7, 0.8, 0.8, 0.85, 0.85] + [0.3] * 8, [(8, 8), (8, 8)], [(1, 8, False), (101, 8, False)]),
])
def test_an_attempt_starts_again_on_its_plateau_or_unlearned_at_its_end(monkeypatch, accs, runs, tried):
    """Attempts but the last stop at plateau_steps if their dense probes are still below LEAVING there, and start
    again after dense_steps if they climbed but did not learn; the learning rate's schedule spans dense_steps in each
    (so seed 0's first attempt trains as it always did)."""
    from dataclasses import replace
    s = replace(needle_training.SETUPS["quick"], dense_steps=8, plateau_steps=4, attempts=2, dim=16)
    ran, scores = [], iter(accs)

    def fake_train(model, batch, cfg, until=None, **kw):
        done = 0
        while done < cfg.steps:
            done += 1
            if until is not None and until(done):
                break
        ran.append((cfg.steps, done))
        return model

    monkeypatch.setattr(needle_training, "CHECK_EVERY", 1)
    monkeypatch.setattr(needle_training, "probe", lambda *a, **k: {"acc": next(scores)})
    monkeypatch.setattr(needle_training, "train_in_memory", fake_train)
    monkeypatch.setattr(needle_training, "make_task", lambda tc: _FakeTask(tc))
    monkeypatch.setattr(needle_training, "evaluate", lambda *a: {"val_loss": 1.0})
    out = needle_training._train_job(s, "cpu", seed=1)
    assert ran[:-1] == runs  # the last run is the mixed phase
    assert [(a["init"], a["steps"], a["learned"]) for a in out["dense_phase"]["attempts"]] == tried


class _FakeTask:
    def __init__(self, tc):
        self.cfg, self.train_ids = tc, torch.tensor(list(TEXT * 4))

    def batch(self, step):
        return None

    def eval_batches(self):
        return []
