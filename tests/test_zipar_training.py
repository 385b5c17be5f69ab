"""ZipAR-tolerant training: the teacher-forced mask hides from each token exactly what ZipAR
decoding has not written when it samples that token, so one pass trains for parallel decoding."""

from __future__ import annotations

import pytest
import torch

from mulo.methods.zipar import RowFill, passes, training_mask
from mulo.runner import ModelRunner
from tests.helpers import tiny_gpt


@pytest.mark.parametrize("height, width, window", [(4, 4, 2), (5, 6, 2), (6, 5, 1), (5, 5, 3), (4, 4, 4)])
def test_passes_follow_zipar_schedule(height, width, window):
    order = passes(height, width, window).view(height, width)
    assert int(order.max()) + 1 == (height * width if window >= width else 2 * width + (height - 2) * window)
    assert (order[:, 1:] == order[:, :-1] + 1).all()  # a row advances one token per pass
    assert (order[1, 0] == width).all()  # row 1 waits for row 0 to finish
    if window < width:  # row i starts in the pass that samples (i - 1, window)
        assert (order[2:, 0] == order[1:-1, window]).all()


@pytest.mark.parametrize("window", [1, 2, 3])
def test_teacher_forced_probs_under_the_mask_equal_zipar_decoding(window):
    """Every query of one masked teacher-forced pass gets the distribution ZipAR decoding gets. The
    decoding draws one constant token, so a proxy (the row's latest token, fed at the slot of the
    row above's last token until that one is sampled) holds what the teacher-forced slot holds:
    what is compared is only which slots each query sees, directly and through the K/V of the
    slots it sees (computed when they were fed)."""
    side, vocab = 5, 16
    model = tiny_gpt(seed=3, vocab=vocab, side=side)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(4))
    runner = ModelRunner(model, cond, guidance=1.0, temperature=1.0, top_k=0, top_p=1.0)
    runner.prefill()
    seq = torch.full((side * side,), -1, dtype=torch.long)
    decoded = torch.empty(side * side, vocab)
    drawn = []

    def draw(probs):
        drawn.append(probs)
        return torch.full((len(probs),), 7)

    fill = RowFill(runner, seq, (0, side), window, draw)
    while not fill.finished:
        produced = fill.step()
        decoded[produced] = drawn[-1]
    with torch.no_grad():
        forced = torch.softmax(model(seq[None, :-1], cond[None], training_mask(2, side, side, window))[0], -1)
        causal = torch.softmax(model(seq[None, :-1], cond[None])[0], -1)
    torch.testing.assert_close(forced, decoded)
    assert not torch.allclose(forced, causal, atol=1e-3)  # and ZipAR's view is not the causal one
