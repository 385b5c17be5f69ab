"""Cost profile of a Tar-sized AR-DTok: one sequential decoding step vs one verification pass.

With random weights (the cost does not depend on their values) and Tar's shapes (729 condition
features of width 1152, vocabulary 16384, CFG batch 2), at the 512 px (32x32) and 1024 px (64x64)
sequence lengths. The ratio verify/step converts NFE counts into projected Tar-scale speed-ups:
a method that needs ``n_steps`` sequential steps and ``n_verify`` full passes costs about
``n_steps + n_verify * ratio`` steps, against ``H * W`` steps for AR.
"""

from __future__ import annotations

import statistics
import time

import torch

from mulo.models.gpt import GPT, GPTConfig, KVCache

COND_LEN, COND_DIM, VOCAB = 729, 1152, 16384


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def profile(preset="llama-abs-LP", sides=(32, 64), device="cuda", dtype=torch.bfloat16, repeats=5, **shape) -> list:
    """[{side, tokens, step_s, verify_s, ratio}] for each grid side (Tar shapes unless overridden)."""
    device = torch.device(device)
    shape = {"cond_len": COND_LEN, "cond_dim": COND_DIM, "vocab": VOCAB, **shape}
    rows = []
    for side in sides:
        step_s, verify_s = _profile_side(preset, side, device, dtype, repeats, **shape)
        rows.append(
            {"side": side, "tokens": side * side, "step_s": step_s, "verify_s": verify_s, "ratio": verify_s / step_s}
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _profile_side(preset, side, device, dtype, repeats, cond_len, cond_dim, vocab) -> tuple[float, float]:
    """A step = 1 new token against a full KV cache; a verification pass = every image token at
    once after the condition (CFG batch 2 for both)."""
    n = side * side
    config = GPTConfig.preset(preset, vocab_size=vocab, max_seq_len=n, cond_len=cond_len, cond_dim=cond_dim)
    model = GPT(config).to(device=device, dtype=dtype).eval()
    cache = KVCache(config, 2, device, dtype)
    cond = torch.randn(2, cond_len, cond_dim, device=device, dtype=dtype)
    prefix_mask = torch.ones(cond_len, cond_len, dtype=torch.bool, device=device).tril()
    model.forward_embeddings(model.embed_condition(cond), torch.arange(cond_len, device=device), prefix_mask, cache)
    tokens = torch.randint(vocab, (2, n - 1), device=device)
    slots = torch.arange(cond_len, cond_len + n - 1, device=device)
    verify_mask = torch.arange(cond_len + n - 1, device=device)[None, :] <= slots[:, None]
    step_mask = torch.ones(1, cond_len + n - 1, dtype=torch.bool, device=device)

    def verify():
        model.forward_embeddings(model.embed_tokens(tokens), slots, verify_mask, cache)

    def step():  # the last token, with every earlier slot written by the verification pass
        model.forward_embeddings(model.embed_tokens(tokens[:, -1:]), slots[-1:], step_mask, cache)

    verify_s = _timed(verify, device, repeats)
    return _timed(step, device, repeats), verify_s
