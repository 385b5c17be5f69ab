"""Our GPT reproduces Tar's AR-DTok on the golden tiny checkpoint (tests/data/golden_tar)."""

import os

import pytest
import torch

from mulo.models.ar_dtok import load_ar_dtok
from mulo.models.gpt import KVCache
from mulo.sampling import cfg_combine, logits_to_probs

ATOL = 1e-4


@pytest.fixture(scope="module")
def ref(golden_dir):
    return torch.load(os.path.join(golden_dir, "ar_dtok_tiny_ref.pt"), weights_only=True)


@pytest.fixture(scope="module")
def model(golden_dir):
    return load_ar_dtok(os.path.join(golden_dir, "ar_dtok_tiny.pth"))


def cached_logits(model, cond, tokens):
    """Prefill the condition, then feed one token per step through the KV cache."""
    n_cond = cond.shape[1]
    cache = KVCache(model.config, cond.shape[0], "cpu", torch.float32, n_slots=n_cond + tokens.shape[1] - 1)
    rows = []
    with torch.no_grad():
        mask = torch.ones(n_cond, n_cond, dtype=torch.bool).tril()
        rows.append(model.forward_embeddings(model.embed_condition(cond), torch.arange(n_cond), mask, cache)[:, -1])
        for i in range(tokens.shape[1] - 1):
            slot = torch.tensor([n_cond + i])
            step_mask = torch.ones(1, n_cond + i + 1, dtype=torch.bool)
            rows.append(
                model.forward_embeddings(model.embed_tokens(tokens[:, i : i + 1]), slot, step_mask, cache)[:, 0]
            )
    return torch.stack(rows, 1)


def guided_teacher_forced(model, cond, tokens, scale):
    with torch.no_grad():
        both = model(torch.cat([tokens, tokens])[:, :-1], torch.cat([cond, model.null_condition(cond)]))
    c, u = both.chunk(2)
    return cfg_combine(c, u, scale)


@pytest.mark.parametrize("prefix", ["", "short_"])
def test_teacher_forced_and_cached_logits(model, ref, prefix):
    cond = ref[f"{prefix}cond"] if prefix else ref["cond"]
    tokens = ref["tokens"]
    with torch.no_grad():
        teacher = model(tokens[:, :-1], cond)
    torch.testing.assert_close(teacher, ref[f"{prefix}teacher_forced_logits"], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(
        cached_logits(model, cond, tokens), ref[f"{prefix}kv_cache_logits"], atol=ATOL, rtol=ATOL
    )


@pytest.mark.parametrize("run", ["sample", "topk_topp", "short_sample"])
def test_cfg_step_distributions(model, ref, run):
    cond = ref["short_cond"] if run.startswith("short") else ref["cond"]
    tokens = ref[f"{run}_tokens"].long()
    scale = 4.0
    top_k = int(ref["topk_topp_top_k"]) if run == "topk_topp" else 0
    top_p = float(ref["topk_topp_top_p"]) if run == "topk_topp" else 1.0
    guided = guided_teacher_forced(model, cond, tokens, scale)
    torch.testing.assert_close(guided, ref[f"{run}_cfg_logits"], atol=ATOL, rtol=ATOL)
    probs = logits_to_probs(guided, 1.0, top_k, top_p)
    torch.testing.assert_close(probs, ref[f"{run}_probs"], atol=1e-5, rtol=0)
    if top_k:  # filtered entries are exactly zero, as in the reference
        assert torch.equal(probs == 0, ref[f"{run}_probs"] == 0)


@pytest.mark.parametrize("run", ["sample", "topk_topp", "short_sample"])
def test_sampled_tokens_reproduce_with_a_request_generator(model, ref, run):
    """The reference drew one multinomial per step from the seeded global generator; a
    per-request generator with the same seed gives the same stream, hence the same tokens."""
    cond = ref["short_cond"] if run.startswith("short") else ref["cond"]
    seed_key = {"sample": "sample_seed", "topk_topp": "topk_topp_seed", "short_sample": "short_sample_seed"}[run]
    top_k = int(ref["topk_topp_top_k"]) if run == "topk_topp" else 0
    top_p = float(ref["topk_topp_top_p"]) if run == "topk_topp" else 1.0
    gen = torch.Generator().manual_seed(int(ref[seed_key]))
    n_cond, length = cond.shape[1], ref["tokens"].shape[1]
    batch = torch.cat([cond, model.null_condition(cond)])
    cache = KVCache(model.config, batch.shape[0], "cpu", torch.float32, n_slots=n_cond + length - 1)
    out = []
    with torch.no_grad():
        mask = torch.ones(n_cond, n_cond, dtype=torch.bool).tril()
        logits = model.forward_embeddings(model.embed_condition(batch), torch.arange(n_cond), mask, cache)[:, -1]
        for i in range(length):
            c, u = logits.chunk(2)
            token = torch.multinomial(logits_to_probs(cfg_combine(c, u, 4.0), 1.0, top_k, top_p), 1, generator=gen)
            out.append(token)
            if i + 1 < length:
                slot = torch.tensor([n_cond + i])
                step_mask = torch.ones(1, n_cond + i + 1, dtype=torch.bool)
                logits = model.forward_embeddings(
                    model.embed_tokens(torch.cat([token, token])), slot, step_mask, cache
                )[:, 0]
    assert torch.equal(torch.cat(out, 1), ref[f"{run}_tokens"].long())


def test_loader_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "bad.pth"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(ValueError, match="not an AR-DTok checkpoint"):
        load_ar_dtok(path)
