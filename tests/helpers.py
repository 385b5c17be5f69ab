"""Small builders shared by the method tests."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

from mulo.config import GenerationConfig
from mulo.methods.common import DecodeContext
from mulo.models.gpt import GPT, GPTConfig, init_random_
from mulo.sampling import cfg_combine, logits_to_probs, uniform
from mulo.streams import Returning
from mulo.timing import PhaseTimer

REPO = Path(__file__).resolve().parents[1]


def worker_port(base: int) -> int:
    """A server port of its own for each pytest-xdist worker (gw0: ``base``, gw1: ``base + 10``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return base + 10 * int(worker[2:]) if worker else base


def run_cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mulo ARGS`` from the repository root, with extra environment variables."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [sys.executable, "-m", "mulo", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)


def tiny_gpt(
    seed: int,
    vocab: int,
    side: int | None = None,
    dim_preset: str = "test-tiny",
    std: float = 0.5,
    grid=None,
    neighbour_inputs: int = 0,
    rotary_2d: bool = False,
) -> GPT:
    """A random GPT over a ``side`` x ``side`` grid (or ``grid``, ``(height, width)``), reading
    the row above when ``neighbour_inputs`` is 3, turning by 2D cells when ``rotary_2d``."""
    height, width = grid or (side, side)
    config = GPTConfig.preset(
        dim_preset,
        vocab_size=vocab,
        max_seq_len=height * width,
        cond_len=2,
        cond_dim=4,
        multiple_of=32,
        grid=grid,
        neighbour_inputs=neighbour_inputs,
        rotary_2d=rotary_2d,
    )
    return init_random_(GPT(config), seed, std=std).eval()


def tiny_vq_model(seed: int = 4, codes: int = 128):
    """A random ``diffusers.VQModel`` of 4 px tokens (the recipes' VQ at 16 channels a block), for
    the tests of the conv VQ's tokenizer; the toy family's VQ is a codebook of squares."""
    from mulo.models.vq import build_model
    from mulo.train.recipes import vq_config

    small = dict(block_out_channels=(16, 16, 16), latent_channels=4, vq_embed_dim=4, norm_num_groups=8)
    with torch.random.fork_rng():  # diffusers initialises from the global RNG
        torch.manual_seed(seed)
        model = build_model(vq_config(codes, 4, **small))
        torch.nn.init.normal_(model.quantize.embedding.weight)
    return model


def run_method(fn, family, cond, seed: int, **knobs):
    """Run a method generator directly (no engine, no VQ); returns (tokens [H, W], rounds, ctx)."""
    config = GenerationConfig.from_dict(knobs)
    ctx = DecodeContext(family, cond, config, torch.Generator().manual_seed(seed), PhaseTimer("cpu"))
    run = Returning(fn(ctx))
    rounds = list(run)
    return run.value, rounds, ctx


# Sampling that spreads ``spread_target`` over many of its 81 sequences: no guidance, a high
# temperature. The lossless tests need it: on a target that draws one image 96 % of the time
# their chi-square test passed even samplers that accept 1.3x too often.
SPREAD_SAMPLING = dict(cfg=1.0, temperature=2.5)


def spread_target() -> tuple[GPT, torch.Tensor]:
    """A 3-token 2x2 target and its condition. Under ``SPREAD_SAMPLING`` the likeliest sequence
    has 23 % of the mass and 25 sequences expect >= 5 of 1000 samples; the next token depends
    strongly on the previous one (weights std 0.8), so a draft made in another context is off."""
    return tiny_gpt(41, 3, 2, std=0.8), torch.randn(2, 4, generator=torch.Generator().manual_seed(6))


def bare_family(target, draft_model=None):
    return SimpleNamespace(name="bare", target=target, draft_model=draft_model, grid=target.config.grid_hw)


@torch.no_grad()
def exact_sequence_distribution(model: GPT, cond: torch.Tensor, cfg_scale: float, temperature: float = 1.0):
    """Probability of every token sequence under the model (CFG, temperature), by enumeration."""
    vocab, n = model.config.vocab_size, model.config.max_seq_len
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=n)))
    batch = len(seqs)
    c = model(seqs[:, :-1], cond[None].expand(batch, -1, -1))
    u = model(seqs[:, :-1], model.null_condition(cond)[None].expand(batch, -1, -1))
    probs = logits_to_probs(cfg_combine(c, u, cfg_scale), temperature)
    return seqs, probs.gather(-1, seqs[..., None])[..., 0].prod(-1)


@contextmanager
def one_torch_thread():
    """Run torch on one thread: a tiny model's forward pass is all overhead, and on a shared machine
    a second thread waiting for a busy core made the lossless tests over 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sequence_counts(fn, family, cond, n_samples: int, **knobs) -> torch.Tensor:
    """How often each token sequence came out of ``n_samples`` seeded runs of method ``fn``, indexed
    in ``exact_sequence_distribution``'s (itertools) order."""
    vocab = family.target.config.vocab_size
    counts = torch.zeros(vocab**family.target.config.max_seq_len)
    with one_torch_thread():
        for seed in range(n_samples):
            tokens, _, _ = run_method(fn, family, cond, seed, **knobs)
            flat = tokens.reshape(-1).tolist()
            counts[sum(t * vocab ** (len(flat) - 1 - i) for i, t in enumerate(flat))] += 1
    return counts


def assert_spread(p_target: torch.Tensor, n_samples: int, min_bins: int = 10) -> None:
    """The target is spread enough for a chi-square test over whole sequences to have power: at
    least ``min_bins`` sequences expect 5 or more of ``n_samples`` draws (rarer ones are pooled into
    one bin) and no sequence holds most of the mass. A target that almost always draws the same
    image cannot tell a lossy sampler from a lossless one."""
    expected_bins = int((p_target * n_samples >= 5).sum())
    assert expected_bins >= min_bins, f"only {expected_bins} sequences expect >= 5 of {n_samples} samples"
    assert float(p_target.max()) < 0.5, f"one sequence holds {float(p_target.max()):.0%} of the mass"


def chi_square(counts: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square with bins of expected count < 5 pooled; returns (statistic, dof)."""
    total = counts.sum()
    expected = expected_probs * total
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Upper critical value (z = 3.09: p = 0.001) by the Wilson-Hilferty approximation."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


# -- lossy verification rules: stand-ins for mulo.sampling's that the lossless tests must catch --


def accept_ignoring_q(p_draft, q_draft, generator):
    """Bug: accept with p(x) instead of min(1, p(x) / q(x))."""
    return uniform(p_draft.shape, generator, p_draft.device) < p_draft


def accept_too_often(p_draft, q_draft, generator):
    """Bug: accept with min(1, 1.3 p(x) / q(x))."""
    return uniform(p_draft.shape, generator, p_draft.device) * q_draft < 1.3 * p_draft


def resample_from_p(p, q):
    """Bug: after a rejection sample from p instead of the residual norm(max(0, p - q))."""
    return p


def check_oracle_table(rows: list[dict]) -> None:
    """A VQ study's oracle MuLo-SD table (``mulo.eval.ceilings.oracle_table``) as a smoke run records
    it: every (r, k, radius) setting once, acceptance a share, ZipAR's bound a speed-up."""
    settings = {(row["r"], row["k"], row["l"]) for row in rows}
    assert settings == {(r, k, radius) for r in (2, 4) for k in (0, 4) for radius in range(4)}
    assert all(0 <= row["accepted"] <= 1 and row["speedup_zipar_w8"] > 0 for row in rows)
