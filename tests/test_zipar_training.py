"""ZipAR-tolerant training: the teacher-forced mask hides from each token exactly what ZipAR
decoding has not written when it samples that token, so one pass trains for parallel decoding."""

from __future__ import annotations

import pytest
import torch

from mulo.methods import zipar
from mulo.methods.zipar import RowFill, passes, proxied_targets, proxy_slots, training_inputs, training_mask
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


def zipar_decode(model, cond, window: int, draw):
    """ZipAR-decode the model's grid with ``draw``; returns (tokens, the probs each token was
    sampled from)."""
    runner = ModelRunner(model, cond, guidance=1.0, temperature=1.0, top_k=0, top_p=1.0)
    runner.prefill()
    n = model.config.max_seq_len
    seq = torch.full((n,), -1, dtype=torch.long)
    decoded = torch.empty(n, model.config.vocab_size)
    drawn = []

    def record(probs):
        drawn.append(probs)
        return draw(probs)

    fill = RowFill(runner, seq, (0, runner.grid[0]), window, record)
    while not fill.finished:
        produced = fill.step()
        decoded[produced] = drawn[-1]
    return seq, decoded


@pytest.mark.parametrize("window,neighbour_inputs", [(1, 0), (2, 0), (3, 0), (2, 3), (3, 3)])
def test_teacher_forced_probs_under_the_mask_equal_zipar_decoding(window, neighbour_inputs):
    """Every query of one masked teacher-forced pass gets the distribution ZipAR decoding gets. The
    decoding draws one constant token, so a proxy (the row's latest token, fed at the slot of the
    row above's last token until that one is sampled) holds what the teacher-forced slot holds:
    what is compared is only which slots each query sees, directly and through the K/V of the
    slots it sees (computed when they were fed). A model that reads the row above finds it known
    in decoding from window 2 on (the windows it trains under), as in the teacher-forced pass."""
    side = 5
    model = tiny_gpt(seed=3, vocab=16, side=side, neighbour_inputs=neighbour_inputs)
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(4))
    seq, decoded = zipar_decode(model, cond, window, lambda probs: torch.full((len(probs),), 7))
    with torch.no_grad():
        forced = torch.softmax(model(seq[None, :-1], cond[None], training_mask(2, side, side, window))[0], -1)
        causal = torch.softmax(model(seq[None, :-1], cond[None])[0], -1)
    torch.testing.assert_close(forced, decoded)
    assert not torch.allclose(forced, causal, atol=1e-3)  # and ZipAR's view is not the causal one


@pytest.mark.parametrize("height, width, window", [(6, 6, 2), (5, 6, 1), (6, 5, 3), (5, 7, 2)])
def test_proxies_in_training_inputs_are_what_zipar_feeds(height, width, window):
    """Sampled (varied) tokens, so a proxy differs from the true row end. With
    ``training_inputs``, every query that runs while all the proxies it sees are in place gets
    the distribution ZipAR decoding gets, the first tokens of rows included (predicted from the
    proxy at their own input slot); with the true row ends (as before) those do not. Queries
    that run after a row end they see is re-fed with its truth are not exact either way."""
    model = tiny_gpt(seed=5, vocab=16, grid=(height, width))
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(6))
    g = torch.Generator().manual_seed(7)
    seq, decoded = zipar_decode(model, cond, window, lambda probs: torch.multinomial(probs, 1, generator=g)[:, 0])
    mask = training_mask(2, height, width, window)
    with torch.no_grad():
        fed = training_inputs(seq[None, :-1], height, width, window)
        forced = torch.softmax(model(fed, cond[None], mask)[0], -1)
        truth = torch.softmax(model(seq[None, :-1], cond[None], mask)[0], -1)

    order = passes(height, width, window)
    slots, sources = proxy_slots(height, width, window)
    assert len(slots) == height - 2
    # query u sees proxy slot v from the pass that starts v's next row; v's true token is
    # re-fed in the pass after it is sampled
    u = torch.arange(height * width)[:, None]
    sees = (slots[None, :] < u) & (order[slots + 1][None, :] <= order[:, None])
    exact = ~(sees & (order[:, None] > order[slots][None, :])).any(1)
    torch.testing.assert_close(forced[exact], decoded[exact])
    # the first token of a row is predicted from the proxy at its own input slot
    row_firsts = (slots + 1)[exact[slots + 1] & (seq[slots] != seq[sources])]
    assert len(row_firsts) and not torch.allclose(truth[row_firsts], decoded[row_firsts], atol=1e-3)


@pytest.mark.parametrize("height, width, window", [(6, 6, 2), (5, 6, 1), (6, 5, 3), (5, 7, 2), (4, 4, 4)])
def test_proxied_targets_are_the_tokens_decoding_predicts_from_a_proxy(monkeypatch, height, width, window):
    """The tokens whose loss the target's recipe can weigh (``Budget.proxy_weight``) are exactly
    those ZipAR decoding predicts from a proxy input, recorded where decoding substitutes one."""
    from_proxy = []

    def recording(seq, inputs, final, width):
        from_proxy.extend(v + 1 for v in inputs.tolist() if not bool(final[v]))
        return proxy_inputs(seq, inputs, final, width)

    proxy_inputs = zipar.proxy_inputs
    monkeypatch.setattr(zipar, "proxy_inputs", recording)
    model = tiny_gpt(seed=8, vocab=16, grid=(height, width))
    cond = torch.randn(2, 4, generator=torch.Generator().manual_seed(9))
    zipar_decode(model, cond, window, lambda probs: torch.full((len(probs),), 3))
    assert sorted(from_proxy) == proxied_targets(height, width, window).tolist()
    assert len(from_proxy) == (height - 2 if window < width else 0)
