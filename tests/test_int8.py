"""int8 weight storage (``mulo.families.int8``): each row within half a quantisation step of the
float16 weights, small and non-float tensors untouched, and a model loaded from it computes what
the float model computes up to that rounding."""

import torch

from mulo.families import int8
from mulo.models.gpt import GPT, GPTConfig, init_random_


def test_rows_round_to_within_half_a_step_and_small_tensors_pass_through():
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(64, 128, generator=gen) * torch.logspace(-3, 0, 64)[:, None]).half()
    weight[5] = 0  # a dead row must not divide by zero
    state = {"w": weight, "norm": torch.rand(128).half(), "small": torch.rand(8, 8).half(), "ids": torch.arange(4)}
    packed = int8.quantize(state)
    assert packed["w"].dtype == torch.int8 and packed["w" + int8.SCALE_SUFFIX].shape == (64,)
    assert packed["w"].abs().amax(dim=1)[torch.arange(64) != 5].eq(127).all()  # each row uses its range
    restored = int8.dequantize(packed)
    assert set(restored) == set(state)
    step = packed["w" + int8.SCALE_SUFFIX].float()[:, None]
    assert ((restored["w"] - weight.float()).abs() <= step / 2 + 1e-6).all()
    assert restored["w"][5].eq(0).all()
    for name in ("norm", "small"):
        assert torch.equal(restored[name], state[name].float())
    assert torch.equal(restored["ids"], state["ids"])


def test_a_convolution_kernel_rounds_per_output_channel_and_a_position_table_passes_through():
    """The scenes up-samplers ship as int8: a ``[out, in, kh, kw]`` kernel gets one scale per output
    channel; a GPT's ``abs_pe [1, L, D]`` would get one scale for all of it, so 3-D stays as it is."""
    gen = torch.Generator().manual_seed(3)
    kernel = (torch.randn(32, 16, 3, 3, generator=gen) * torch.logspace(-2, 0, 32)[:, None, None, None]).half()
    table = torch.randn(1, 64, 128, generator=gen).half()
    packed = int8.quantize({"conv": kernel, "abs_pe": table})
    assert packed["conv"].shape == kernel.shape and packed["conv" + int8.SCALE_SUFFIX].shape == (32,)
    assert packed["abs_pe"].dtype == torch.float16 and "abs_pe" + int8.SCALE_SUFFIX not in packed
    restored = int8.dequantize(packed)
    step = packed["conv" + int8.SCALE_SUFFIX].float()[:, None, None, None]
    assert ((restored["conv"] - kernel.float()).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(restored["abs_pe"], table.float())


def test_a_gpt_loaded_from_int8_keeps_its_distribution():
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, dim=64, n_layer=2, n_head=4, cond_len=2, cond_dim=8))
    init_random_(model, seed=0)
    half = {k: v.half() for k, v in model.state_dict().items()}
    reference = GPT(model.config)
    reference.load_state_dict({k: v.float() for k, v in half.items()})
    loaded = GPT(model.config)
    loaded.load_state_dict(int8.dequantize(int8.quantize(half)))
    tokens = torch.randint(0, 64, (2, 15), generator=torch.Generator().manual_seed(1))
    cond = torch.randn(2, 2, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        p = reference(tokens, cond).log_softmax(-1)
        q = loaded(tokens, cond).log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).mean()
    assert 0 < kl < 1e-3, kl  # changed, but by rounding only (emoji-16's target: 6e-5 nats a token)
