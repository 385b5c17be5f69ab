"""Tar's first stage: the LLM writes an image as TA-Tok code tokens ``<I0>`` ... ``<I65535>``.

Tar-1.5B / Tar-7B are Qwen2 causal LMs (transformers) whose vocabulary holds one token per TA-Tok
code. Text-to-image (Tar's ``t2i_inference.py``): the chat template with a system and a user turn,
the generation prompt, then ``<im_start><S{scale}>``; sample ``n`` new tokens (temperature 1.0,
top-p 0.95, top-k 1200); keep the codes of the ``<I…>`` tokens in order, truncate or pad with
code 0 to ``n`` (729 = 27x27 at scale 0). Tar samples through ``model.generate`` and the global
RNG; we run the same loop ourselves with the KV cache so that a per-request CPU ``torch.Generator``
makes a request reproducible from its seed on any device.
"""

from __future__ import annotations

import re

import torch

from mulo.sampling import logits_to_probs, sample

SYSTEM_PROMPT = "You are a helpful assistant."
IMAGE_TOKEN = re.compile(r"^<I(\d+)>$")
# Tokens per image at each TA-Tok scale (27x27, 13x13, 9x9 codes).
SCALE_TOKENS = {0: 729, 1: 169, 2: 81}


class TarLLM:
    """``image_codes(prompt, generator)`` -> ``[n]`` TA-Tok code indices (int64)."""

    def __init__(self, model, tokenizer, scale=0, temperature=1.0, top_p=0.95, top_k=1200, n_codes=None):
        if scale not in SCALE_TOKENS:
            raise ValueError(f"TA-Tok scale must be one of {sorted(SCALE_TOKENS)} (got {scale})")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.scale, self.temperature, self.top_p, self.top_k = scale, temperature, top_p, top_k
        self.n_codes = n_codes or SCALE_TOKENS[scale]  # tiny test checkpoints use fewer
        # Vocabulary id -> TA-Tok code (-1 for every text token), built once from the vocabulary.
        code_of = torch.full((len(tokenizer),), -1, dtype=torch.long)
        for token, index in tokenizer.get_vocab().items():
            match = IMAGE_TOKEN.match(token)
            if match and index < len(code_of):
                code_of[index] = int(match.group(1))
        if not bool((code_of >= 0).any()):
            raise ValueError("the tokenizer has no <I…> image tokens: not a Tar checkpoint")
        self.code_of = code_of
        self.stop_ids = set(_as_list(model.generation_config.eos_token_id) or _as_list(tokenizer.eos_token_id))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text += f"<im_start><S{self.scale}>"
        return self.tokenizer(text, return_tensors="pt").input_ids

    @torch.no_grad()
    def sample_ids(self, prompt: str, generator: torch.Generator | None = None) -> list[int]:
        """Up to ``n_codes`` new token ids (fewer when a stop token comes first)."""
        ids = self.prompt_ids(prompt).to(self.device)
        out = self.model(input_ids=ids, use_cache=True)
        new: list[int] = []
        while len(new) < self.n_codes:  # max_new_tokens = n, as in Tar
            probs = logits_to_probs(out.logits[:, -1], self.temperature, self.top_k, self.top_p)
            token = sample(probs.cpu(), generator)  # [1]; on the CPU, as every mulo sampler
            if int(token) in self.stop_ids:
                break
            new.append(int(token))
            if len(new) < self.n_codes:
                step = token[:, None].to(self.device)
                out = self.model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
        return new

    def codes_from_ids(self, ids: list[int]) -> torch.Tensor:
        """The codes of the ``<I…>`` tokens among ``ids`` in order, cut or padded with 0 to n."""
        codes = [int(self.code_of[i]) for i in ids if i < len(self.code_of) and self.code_of[i] >= 0]
        codes = codes[: self.n_codes] + [0] * (self.n_codes - len(codes))  # Tar pads with code 0
        return torch.tensor(codes, dtype=torch.long)

    def image_codes(self, prompt: str, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.codes_from_ids(self.sample_ids(prompt, generator))


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [int(value)]
