"""Standard speculative decoding is lossless: its output follows the target exactly."""

import torch

from mulo.methods import ar, sjd, speculative
from tests.helpers import (
    bare_family,
    chi_square,
    chi_square_critical,
    exact_sequence_distribution,
    sequence_counts,
    tiny_gpt,
)

VOCAB, SIDE = 3, 2  # 81 possible 2x2 images: small enough to enumerate


def test_sd_matches_the_target_sequence_distribution():
    target = tiny_gpt(11, VOCAB, SIDE)
    drafter = tiny_gpt(12, VOCAB, SIDE, std=0.8)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    _, p_target = exact_sequence_distribution(target, cond, cfg_scale=2.0)
    _, p_drafter = exact_sequence_distribution(drafter, cond, cfg_scale=2.0)
    counts = sequence_counts(speculative.generate, bare_family(target, drafter), cond, 2000, cfg=2.0, draft_len=3)
    stat, dof = chi_square(counts, p_target)
    assert stat < chi_square_critical(dof), (stat, dof)
    # The test has power: the drafter's own distribution is rejected by a wide margin.
    stat_q, dof_q = chi_square(counts, p_drafter)
    assert stat_q > 3 * chi_square_critical(dof_q), (stat_q, dof_q)


def test_sjd_matches_the_target_sequence_distribution():
    target = tiny_gpt(21, VOCAB, SIDE)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(6))
    _, p_target = exact_sequence_distribution(target, cond, cfg_scale=1.0)
    counts = sequence_counts(sjd.generate, bare_family(target), cond, 2000, cfg=1.0, sjd_window=3)
    stat, dof = chi_square(counts, p_target)
    assert stat < chi_square_critical(dof), (stat, dof)


def test_ar_matches_the_target_sequence_distribution():
    target = tiny_gpt(31, VOCAB, SIDE)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(7))
    _, p_target = exact_sequence_distribution(target, cond, cfg_scale=3.0)
    counts = sequence_counts(ar.generate, bare_family(target), cond, 1500, cfg=3.0)
    stat, dof = chi_square(counts, p_target)
    assert stat < chi_square_critical(dof), (stat, dof)
