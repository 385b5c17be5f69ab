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
    """[{side, step_s, verify_s, ratio}]: a step = 1 new token against a full KV cache; a
    verification pass = every image token at once (the cache then holds the condition)."""
    device = torch.device(device)
    cond_len, cond_dim, vocab = (
        shape.get("cond_len", COND_LEN),
        shape.get("cond_dim", COND_DIM),
        shape.get("vocab", VOCAB),
    )
    rows = []
    for side in sides:
        cfg = GPTConfig.preset(preset, vocab_size=vocab, max_seq_len=side * side, cond_len=cond_len, cond_dim=cond_dim)
        model = GPT(cfg).to(device=device, dtype=dtype).eval()
        n = side * side
        cond = torch.randn(2, cond_len, cond_dim, device=device, dtype=dtype)
        cache = KVCache(cfg, 2, device, dtype)
        slots = torch.arange(cond_len, device=device)
        model.forward_embeddings(
            model.embed_condition(cond),
            slots,
            torch.ones(cond_len, cond_len, dtype=torch.bool, device=device).tril(),
            cache,
        )
        tokens = torch.randint(vocab, (2, n - 1), device=device)
        all_slots = torch.arange(cond_len, cond_len + n - 1, device=device)
        width = cond_len + n - 1
        verify_mask = torch.arange(width, device=device)[None, :] <= all_slots[:, None]

        def verify():
            model.forward_embeddings(model.embed_tokens(tokens), all_slots, verify_mask, cache)

        verify()  # fills every slot, so the step below attends to a full-length cache
        last = all_slots[-1:]
        step_mask = torch.ones(1, width, dtype=torch.bool, device=device)

        def step():
            model.forward_embeddings(model.embed_tokens(tokens[:, -1:]), last, step_mask, cache)

        step_s, verify_s = _timed(step, device, repeats), _timed(verify, device, repeats)
        rows.append({"side": side, "tokens": n, "step_s": step_s, "verify_s": verify_s, "ratio": verify_s / step_s})
        del model, cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
