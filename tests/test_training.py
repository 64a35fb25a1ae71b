"""Training: every family learns, resume is exact even after SIGKILL, divergence stops cleanly."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from attnlab.checkpoint import load_checkpoint, verify
from attnlab.config import TrainConfig
from attnlab.errors import CheckpointError, ConfigError, TrainingDiverged
from attnlab.models import build_model
from attnlab.fit import lm_loss, lr_at, make_optimizer
from attnlab.train import train
from conftest import FAMILIES, tiny

OVERFIT_LOSS = 0.3  # the stated bar: a tiny fixed batch is memorised below this cross-entropy (nats)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_overfits_a_tiny_batch(family):
    torch.manual_seed(0)
    model = build_model(tiny(family=family, dim=64))
    opt = make_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.0))
    x = torch.randint(0, 37, (4, 24))
    y = torch.roll(x, -1, dims=1)
    for _ in range(150):
        loss = lm_loss(model(x)[0], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < OVERFIT_LOSS, f"{family} only reached {loss.item():.3f}"


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == pytest.approx(0.1)


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400)))
    return f


def _cfgs(text_file, **kw):
    t = dict(data=str(text_file), steps=24, batch_size=4, seq_len=32, save_every=6, eval_every=8,
             log_every=2, warmup_steps=4, eval_batches=2, dropout_free=None)
    t.pop("dropout_free")
    t.update(kw)
    return tiny(vocab_size=256, dropout=0.1), TrainConfig(**t)


def _losses(folder):
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, (folder / "metrics.jsonl")
            .read_text().splitlines())]


def test_resume_in_process_is_exact(tmp_path, text_file):
    m, t = _cfgs(text_file)
    train(m, t, tmp_path / "full", progress=False)
    # a run done in slices: stopped after step 13, with the torn metrics tail a kill can leave, then resumed
    train(m, t, tmp_path / "cut", progress=False, stop_after=13)
    (tmp_path / "cut" / "metrics.jsonl").open("a").write('{"step": 14, "loss": 9.9}\n{"step": 1')  # torn tail
    train(m, t, tmp_path / "cut", resume=True, progress=False)
    a = (tmp_path / "full" / "model.safetensors").read_bytes()
    b = (tmp_path / "cut" / "model.safetensors").read_bytes()
    assert a == b
    assert _losses(tmp_path / "full") == _losses(tmp_path / "cut")


def test_resume_after_sigkill_is_exact(tmp_path, text_file):
    """Kill -9 the CLI at unpredictable moments, twice, then --resume: same bytes as an uninterrupted run."""
    args = [sys.executable, "-m", "attnlab", "train", "--preset", "tiny", "--data", str(text_file),
            "--steps", "60", "--batch-size", "4", "--seq-len", "32", "--save-every", "5", "--eval-every", "10",
            "--log-every", "1", "--threads", "1", "--quiet", "--dropout", "0.1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(args + ["--out", str(tmp_path / "full")], check=True, env=env, capture_output=True)
    cut = tmp_path / "cut"
    for wait_steps in (12, 33):  # kill once past these many logged steps (mid-step, not at a checkpoint)
        proc = subprocess.Popen(args + ["--out", str(cut)] + (["--resume"] if cut.exists() else []), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            metrics = cut / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().count('"loss"') >= wait_steps:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = subprocess.run(args + ["--out", str(cut), "--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    verify(cut)
    assert (tmp_path / "full" / "model.safetensors").read_bytes() == (cut / "model.safetensors").read_bytes()
    assert _losses(tmp_path / "full") == _losses(cut)


def test_resume_with_different_settings_is_refused(tmp_path, text_file):
    m, t = _cfgs(text_file, steps=6)
    train(m, t, tmp_path / "r", progress=False)
    _, t_other = _cfgs(text_file, steps=12, lr=1e-4)
    with pytest.raises(ConfigError, match="train.lr: saved 0.003, now 0.0001"):
        train(m, t_other, tmp_path / "r", resume=True, progress=False)


def test_existing_checkpoint_is_not_overwritten_silently(tmp_path, text_file):
    m, t = _cfgs(text_file, steps=4)
    train(m, t, tmp_path / "r", progress=False)
    with pytest.raises(CheckpointError, match="--resume"):
        train(m, t, tmp_path / "r", progress=False)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, text_file):
    m, t = _cfgs(text_file, steps=30, lr=1e30, grad_clip=0.0, warmup_steps=0, save_every=1)
    with pytest.raises(TrainingDiverged, match=r"at step (\d+); .*last good checkpoint \(step \d+\)") as info:
        train(m, t, tmp_path / "nan", progress=False)
    manifest = verify(tmp_path / "nan")
    bad_step = int(str(info.value).split("at step ")[1].split(";")[0])
    assert manifest["step"] == bad_step - 1
    model, _ = load_checkpoint(tmp_path / "nan")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("task", ["copy", "mqar"])
def test_synthetic_tasks_report_accuracy(tmp_path, task):
    cfg = TrainConfig(task=task, steps=4, batch_size=4, seq_len=32, synth_vocab=32, n_pairs=4, eval_batches=1,
                      eval_every=4)
    summary = train(tiny(), cfg, tmp_path / task, progress=False)
    assert 0.0 <= summary["val_acc"] <= 1.0 and summary["params"] > 0


def test_learned_positions_reject_long_sequences(tmp_path, text_file):
    _, t = _cfgs(text_file, seq_len=128)
    with pytest.raises(ConfigError, match="max_seq_len=64"):
        train(tiny(pos="learned", vocab_size=256), t, tmp_path / "l", progress=False)
    model = build_model(tiny(pos="learned"))
    with pytest.raises(ConfigError, match="beyond the learned positional table"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_distill_loss_is_kl_to_the_teacher():
    from attnlab.fit import distill_loss

    y = torch.randint(0, 11, (2, 5))
    t = torch.randn(2, 5, 11)
    assert float(distill_loss(t.clone(), t, y)) == pytest.approx(0.0, abs=1e-6)
    s = torch.randn(2, 5, 11)
    p, log_q = t.softmax(-1), s.log_softmax(-1)
    expected = (p * (p.log() - log_q)).sum(-1).mean()
    assert float(distill_loss(s, t, y)) == pytest.approx(float(expected), rel=1e-5)
    assert float(distill_loss(s, t, y, weight=0.0)) == pytest.approx(float(lm_loss(s, y)), rel=1e-6)
    sharp = (t / 0.5).softmax(-1)
    expected = (sharp * (sharp.log() - log_q)).sum(-1).mean()
    assert float(distill_loss(s, t, y, temperature=0.5)) == pytest.approx(float(expected), rel=1e-5)


def test_distilled_student_agrees_with_its_teacher_more_than_a_plain_one(tmp_path, text_file):
    _, t = _cfgs(text_file, steps=60, save_every=0, eval_every=60)
    teacher = train(tiny(vocab_size=256, dim=48), t, tmp_path / "teacher", progress=False)
    small = tiny(vocab_size=256, dim=32, n_layers=1)
    plain_t = TrainConfig(**{**t.to_dict(), "steps": 150, "eval_every": 150, "lr": 1e-2})
    distill_t = TrainConfig(**{**plain_t.to_dict(), "distill_from": str(tmp_path / "teacher")})
    plain = train(small, plain_t, tmp_path / "plain", progress=False)
    distilled = train(small, distill_t, tmp_path / "student", progress=False)
    assert "teacher_agreement" not in plain and teacher["final_step"] == 60
    from attnlab.data.tasks import make_task
    from attnlab.resolve import load_model
    from attnlab.fit import evaluate

    batches = make_task(plain_t).eval_batches()
    tm = load_model(tmp_path / "teacher").model.eval()
    agree = {name: evaluate(load_model(tmp_path / name).model, batches, "cpu", tm)["teacher_agreement"]
             for name in ("plain", "student")}
    assert agree["student"] == pytest.approx(distilled["teacher_agreement"])
    assert agree["student"] > agree["plain"]


def test_distilling_from_another_vocabulary_is_refused(tmp_path, text_file):
    _, t = _cfgs(text_file, steps=2, save_every=0, eval_every=2)
    train(tiny(vocab_size=256), TrainConfig(**{**t.to_dict(), "task": "copy", "data": None, "synth_vocab": 16}),
          tmp_path / "teacher", progress=False)
    with pytest.raises(ConfigError, match="vocabulary"):
        train(tiny(vocab_size=256), TrainConfig(**{**t.to_dict(), "distill_from": str(tmp_path / "teacher")}),
              tmp_path / "student", progress=False)
    with pytest.raises(ConfigError, match="distill_weight"):
        TrainConfig(distill_weight=1.5)
    with pytest.raises(ConfigError, match="distill_temperature"):
        TrainConfig(distill_temperature=0)


def test_in_memory_distillation_imitates_the_teacher():
    """train_in_memory(teacher=...) minimises the KL to the teacher: the student ends up agreeing with the
    teacher's argmax far more than one trained on the same (random) targets."""
    from attnlab.fit import train_in_memory

    torch.manual_seed(0)
    teacher = build_model(tiny(vocab_size=37, init_std=0.3)).eval()
    data = torch.randint(0, 37, (64, 17), generator=torch.Generator().manual_seed(1))

    def batch(step):
        rows = data[(torch.arange(8) + 8 * step) % 64]
        return rows[:, :-1], rows[:, 1:]

    cfg = TrainConfig(steps=60, lr=1e-2, warmup_steps=5)
    students = {}
    for name, t in (("plain", None), ("distilled", teacher)):
        torch.manual_seed(2)
        students[name] = train_in_memory(build_model(tiny(vocab_size=37, dim=32, n_layers=1)), batch, cfg, teacher=t)
    with torch.no_grad():
        want = teacher(data[:, :-1])[0].argmax(-1)
        agree = {n: float((m(data[:, :-1])[0].argmax(-1) == want).float().mean()) for n, m in students.items()}
    assert agree["distilled"] > agree["plain"] + 0.2, agree


def test_in_memory_distillation_from_precomputed_logits_equals_a_live_teacher():
    """A batch of (x, y, teacher_logits) distils exactly as teacher= does (e13 computes its target's logits once)."""
    from attnlab.fit import train_in_memory

    torch.manual_seed(0)
    teacher = build_model(tiny(vocab_size=37, init_std=0.3)).eval()
    data = torch.randint(0, 37, (16, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = teacher(data[:, :-1])[0]

    def batch(step, given=False):
        idx = (torch.arange(4) + 4 * step) % 16
        return (data[idx, :-1], data[idx, 1:]) + ((logits[idx],) if given else ())

    cfg = TrainConfig(steps=8, lr=1e-2, warmup_steps=2)
    students = []
    for kw in (dict(batch=batch, teacher=teacher), dict(batch=lambda s: batch(s, True))):
        torch.manual_seed(2)
        students.append(train_in_memory(build_model(tiny(vocab_size=37, dim=32, n_layers=1)), cfg=cfg, **kw))
    for a, b in zip(*(m.parameters() for m in students)):
        assert torch.equal(a, b)


def test_in_memory_training_under_bf16_autocast_learns():
    """amp=True: bf16 autocast in forward and backward, fp32 weights; the loss on a learnable sequence falls."""
    from attnlab.fit import lm_loss, train_in_memory

    torch.manual_seed(0)
    model = build_model(tiny(vocab_size=37, dim=32, n_layers=1))
    seq = torch.arange(33).remainder(37)[None].repeat(4, 1)
    with torch.no_grad():
        before = float(lm_loss(model(seq[:, :-1])[0], seq[:, 1:]))
    train_in_memory(model, lambda step: (seq[:, :-1], seq[:, 1:]), TrainConfig(steps=30, lr=1e-2, warmup_steps=3),
                    amp=True)
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        assert float(lm_loss(model(seq[:, :-1])[0], seq[:, 1:])) < 0.5 * before
