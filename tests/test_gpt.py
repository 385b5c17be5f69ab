"""The AR transformer and its slot-indexed KV cache."""

import pytest
import torch

from mulo.models.gpt import GPT, GPTConfig, KVCache, init_random_


def tiny(**overrides):
    config = GPTConfig.preset(
        "test-tiny", vocab_size=50, max_seq_len=16, cond_len=3, cond_dim=8, multiple_of=32, **overrides
    )
    return init_random_(GPT(config), seed=1, std=0.3).eval()


def test_lp_preset_matches_ar_dtok_shapes():
    config = GPTConfig.preset("llama-abs-LP", vocab_size=16384, max_seq_len=1024, cond_len=729, cond_dim=1152)
    assert (config.n_layer, config.n_head, config.dim, config.head_dim, config.ffn_hidden) == (30, 20, 1280, 64, 3584)
    assert config.n_positions == 1752  # abs_pe of ar_dtok_lp_512px.pth
    with torch.device("meta"):
        model = GPT(config)
    n_params = sum(p.numel() for p in model.parameters())
    assert 600e6 < n_params < 700e6  # ~632M plus the 512px position table


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(dim=30, n_head=4)
    with pytest.raises(ValueError, match="cond_type"):
        GPTConfig(cond_type="text")
    with pytest.raises(ValueError, match="unknown GPT preset"):
        GPTConfig.preset("llama-abs-Q")


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_cached_step_by_step_equals_teacher_forced(kv_heads):
    model = tiny(n_kv_head=kv_heads)
    cond = torch.randn(2, 3, 8)
    tokens = torch.randint(50, (2, 16))
    with torch.no_grad():
        full = model(tokens[:, :15], cond)  # [2, 16, 50]
        cache = KVCache(model.config, 2, "cpu", torch.float32)
        n_slots = cache.n_slots
        causal = torch.ones(n_slots, n_slots, dtype=torch.bool).tril()
        slots = torch.arange(3)
        first = model.forward_embeddings(model.embed_condition(cond), slots, causal[:3, :3], cache)[:, -1]
        steps = [first]
        for i in range(15):
            slot = torch.tensor([3 + i])
            out = model.forward_embeddings(
                model.embed_tokens(tokens[:, i : i + 1]), slot, causal[slot][:, : 4 + i], cache
            )
            steps.append(out[:, 0])
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_no_mask_is_the_causal_mask(kv_heads):
    # Training passes no mask (the fused causal kernel); it must mean exactly the lower triangle.
    model = tiny(n_kv_head=kv_heads)
    cond, tokens = torch.randn(2, 3, 8), torch.randint(50, (2, 12))
    causal = torch.ones(15, 15, dtype=torch.bool).tril()
    with torch.no_grad():
        implicit = model(tokens, cond)
        explicit = model(tokens, cond, causal)
        full = model(tokens, cond, torch.ones(15, 15, dtype=torch.bool))
    torch.testing.assert_close(implicit, explicit)
    assert not torch.allclose(implicit[:, :-1], full[:, :-1], atol=1e-3)  # the mask is not ignored


def test_custom_mask_equals_recomputation_over_visible_context():
    """A query decoded through the cache with a custom mask gives the logits of a plain forward
    pass over exactly the visible slots (kept at their own positions), whatever else the cache
    holds at the masked-out slots."""
    model = tiny()
    cond = torch.randn(1, 3, 8)
    tokens = torch.randint(50, (1, 12))
    visible = [0, 1, 3, 4, 8]
    hidden = [2, 5, 6, 7, 9, 10]
    cache = KVCache(model.config, 1, "cpu", torch.float32)

    def write(positions, mask_cols):
        slots = torch.tensor([3 + v for v in positions])
        mask = torch.zeros(len(positions), cache.n_slots, dtype=torch.bool)
        for q, s in enumerate(slots.tolist()):
            mask[q, [c for c in mask_cols if c <= s]] = True
        return model.forward_embeddings(model.embed_tokens(tokens[:, positions]), slots, mask, cache)

    with torch.no_grad():
        model.forward_embeddings(
            model.embed_condition(cond), torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril(), cache
        )
        write(hidden, list(range(cache.n_slots)))  # other slots, written first, with any context
        write(visible, [0, 1, 2] + [3 + v for v in visible])  # the visible ones see only each other
        cached = write([11], [0, 1, 2] + [3 + v for v in visible + [11]])[0, 0]
        context = torch.cat([model.embed_condition(cond), model.embed_tokens(tokens[:, visible + [11]])], 1)
        slots = torch.tensor([0, 1, 2] + [3 + v for v in visible + [11]])
        recomputed = model.forward_embeddings(context, slots)[0, -1]  # causal, no cache
        seeing_all = write([11], list(range(cache.n_slots)))[0, 0]
    torch.testing.assert_close(cached, recomputed, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(cached, seeing_all, atol=1e-2)  # the mask did hide something


def test_unwritten_slots_are_never_attended():
    """A mask that admits every slot still only sees written ones: garbage elsewhere is inert."""
    model = tiny()
    cond = torch.randn(1, 3, 8)
    outs = []
    for garbage in (0.0, 1e3):
        cache = KVCache(model.config, 1, "cpu", torch.float32)
        cache.k.fill_(garbage)  # written slots get overwritten, the others keep it
        cache.v.fill_(garbage)
        with torch.no_grad():
            model.forward_embeddings(
                model.embed_condition(cond), torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril(), cache
            )
            everything = torch.ones(1, cache.n_slots, dtype=torch.bool)
            outs.append(
                model.forward_embeddings(
                    model.embed_tokens(torch.tensor([[4]])), torch.tensor([3 + 6]), everything, cache
                )
            )
    torch.testing.assert_close(outs[0], outs[1])


def test_query_must_see_its_own_slot():
    model = tiny()
    cache = KVCache(model.config, 1, "cpu", torch.float32)
    mask = torch.zeros(1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="own slot"):
        model.forward_embeddings(model.embed_tokens(torch.tensor([[1]])), torch.tensor([4]), mask, cache)


def test_class_conditioning_has_a_null_class():
    config = GPTConfig.preset(
        "test-tiny", vocab_size=20, max_seq_len=4, cond_type="class", cond_len=1, cond_dim=10, multiple_of=32
    )
    model = init_random_(GPT(config), seed=0, std=0.3)
    cond = torch.tensor([3])
    assert model.null_condition(cond).tolist() == [10]
    with torch.no_grad():
        assert model(None, cond).shape == (1, 1, 20)
