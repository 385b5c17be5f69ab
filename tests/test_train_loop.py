"""The resumable training loop: its learning-rate schedule and a resume that changes nothing."""

from __future__ import annotations

import math

import pytest
import torch

from mulo.train.loop import MIN_LR_SCALE, lr_scale, train
from mulo.train.stages.card_text import stage_hardware


def test_warm_up_then_cosine():
    assert lr_scale(0, 1000, warmup=100) == MIN_LR_SCALE  # 1 % of the peak, floored
    assert lr_scale(9, 1000, warmup=100) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 0.009)))
    assert lr_scale(99, 1000, warmup=100) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.099)))
    assert lr_scale(500, 1000, warmup=100) == pytest.approx(0.5)
    assert lr_scale(999, 1000, warmup=100) == MIN_LR_SCALE
    assert lr_scale(1200, 1000, warmup=100) == MIN_LR_SCALE  # past the schedule: the floor


class _Stop(Exception):
    pass


def _run(checkpoint, steps, stop_at=None, stats=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(64, 4), torch.randn(64, 1)

    def loss_fn(step):
        if step == stop_at:
            raise _Stop  # the session ends here
        rows = torch.arange(step * 8, step * 8 + 8) % 64  # what a step sees depends on its number only
        return torch.nn.functional.mse_loss(model(data[0][rows]), data[1][rows])

    out = train("t", model, loss_fn, steps, checkpoint, lr=0.05, warmup=2, every=2)
    if stats is not None:
        stats.update(out)
    return model.weight.detach().clone()


def test_a_run_stopped_and_resumed_ends_where_an_uninterrupted_one_does(tmp_path):
    whole = _run(tmp_path / "whole.ckpt", 10)
    with pytest.raises(_Stop):
        _run(tmp_path / "split.ckpt", 10, stop_at=7)  # checkpoint at step 6, step 6 redone
    assert torch.load(tmp_path / "split.ckpt", weights_only=True)["step"] == 6
    assert torch.equal(_run(tmp_path / "split.ckpt", 10), whole)


def test_a_resume_without_adams_moments_warms_the_rate_up_again(tmp_path):
    """A compact resume point (or a stage continued from its weights) has no optimizer moments:
    its first updates would move every weight by the full rate, so the warm-up starts again there."""
    assert lr_scale(649, 1000, warmup=100, warm_from=600) == pytest.approx(0.5 * lr_scale(649, 1000, 100))
    assert lr_scale(699, 1000, warmup=100, warm_from=600) == pytest.approx(lr_scale(699, 1000, 100))
    with pytest.raises(_Stop):
        _run(tmp_path / "t.ckpt", 20, stop_at=11)  # checkpoint at step 10, with moments
    state = torch.load(tmp_path / "t.ckpt", weights_only=True)
    assert state["optimizer"]["state"] and state["warm_from"] == 0
    state["optimizer"]["state"] = {}
    torch.save(state, tmp_path / "bare.ckpt")
    rates = []

    class Spy(torch.optim.AdamW):  # the rate each step ran at
        def step(self, closure=None):
            rates.append(self.param_groups[0]["lr"])
            return super().step(closure)

    import mulo.train.loop as loop

    real = loop.torch.optim.AdamW
    loop.torch.optim.AdamW = Spy
    try:
        with pytest.raises(_Stop):
            _run(tmp_path / "bare.ckpt", 20, stop_at=13)
    finally:
        loop.torch.optim.AdamW = real
    # warm-up of 2 steps from step 10: half the schedule's rate, then all of it
    schedule = [0.05 * lr_scale(step, 20, 2) for step in (10, 11, 12)]
    assert rates == pytest.approx([schedule[0] / 2, *schedule[1:]])
    assert torch.load(tmp_path / "bare.ckpt", weights_only=True)["warm_from"] == 10  # kept on resume


def test_a_stage_finished_on_other_hardware_says_which_ran_which_steps(tmp_path, monkeypatch):
    """The model card's hardware column: a run begun on a CPU and finished on a GPU keeps both."""
    from mulo.train import loop

    monkeypatch.setattr(loop, "hardware", lambda device: "the CPU")
    with pytest.raises(_Stop):
        _run(tmp_path / "t.ckpt", 10, stop_at=5)  # checkpoint at step 4
    stats = {}
    _run(tmp_path / "t.ckpt", 6, stats=stats)  # same hardware: one segment, no "segments" entry
    assert "segments" not in stats
    checkpoint = torch.load(tmp_path / "t.ckpt", weights_only=True)
    assert [(s["hardware"], s["steps"]) for s in checkpoint["segments"]] == [("the CPU", [0, 6])]

    monkeypatch.setattr(loop, "hardware", lambda device: "a GPU")
    _run(tmp_path / "t.ckpt", 10, stats=stats)
    assert [(s["hardware"], s["steps"]) for s in stats["segments"]] == [("the CPU", [0, 6]), ("a GPU", [6, 10])]
    assert sum(s["seconds"] for s in stats["segments"]) == pytest.approx(stats["seconds"], abs=0.2)
    cell = stage_hardware({**stats, "hardware": "a GPU"})
    assert cell.startswith("the CPU: steps 0-6 in ") and "; a GPU: steps 6-10 in " in cell
    assert stage_hardware({"hardware": "a GPU"}) == "a GPU"


def test_bf16_is_chosen_by_measurement_not_by_flags(monkeypatch):
    """Without native bf16 the CPU trains in fp32, untimed; with it, in bf16 only when bf16 matrix
    products measure faster (a Xeon with AVX512-BF16 ran them 1.5x slower)."""
    from mulo.train import loop

    def choice(fp32_seconds: float | None, bf16_seconds: float | None) -> bool:
        if fp32_seconds is None:  # the clock must not be read
            ticks = iter(())
        else:  # five timings per dtype, fp32 first: the start and end of each
            ticks = iter(
                [
                    t
                    for d, s in ((0, fp32_seconds), (100, bf16_seconds))
                    for i in range(5)
                    for t in (d + 10 * i, d + 10 * i + s)
                ]
            )
        monkeypatch.setattr(loop.time, "perf_counter", lambda: next(ticks))
        loop.cpu_bf16_pays.cache_clear()
        try:
            return loop.cpu_bf16_pays()
        finally:
            loop.cpu_bf16_pays.cache_clear()

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert choice(None, None) is False
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert choice(1.0, 0.6) is True
    assert choice(1.0, 1.5) is False


def test_the_stage_keeps_the_weights_of_the_best_held_out_loss_and_resumes_with_them(tmp_path):
    """An over-fitting run: training drives the weight to 3, the held-out loss wants 1, so the
    held-out loss is best part-way; the model ends with those weights, not the last ones, and a
    run stopped and resumed picks the same step."""
    target = torch.tensor([[3.0]])

    def run(checkpoint, stop_at=None):
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)

        def loss_fn(step):
            if step == stop_at:
                raise _Stop
            return ((model.weight - target) ** 2).sum()

        def held_out():
            return float(((model.weight - 1.0) ** 2).sum())

        return model, train("t", model, loss_fn, 40, checkpoint, lr=0.05, warmup=1, every=2, validate=held_out,
                            validate_every=3)  # fmt: skip

    model, stats = run(tmp_path / "a.ckpt")
    steps = [s for s, _ in stats["val_curve"]]
    assert steps == list(range(4, 41, 4))  # rounded up to checkpoint steps (every 2), and the last
    assert stats["best_val_loss"] == min(v for _, v in stats["val_curve"]) < stats["val_curve"][-1][1]
    assert 4 <= stats["best_step"] < 40 and abs(float(model.weight.detach()) - 1.0) < 0.5
    with pytest.raises(_Stop):
        run(tmp_path / "b.ckpt", stop_at=23)
    resumed, again = run(tmp_path / "b.ckpt")
    assert again["best_step"] == stats["best_step"] and again["val_curve"] == stats["val_curve"]
    assert torch.allclose(resumed.weight, model.weight)
