"""A model family: everything one generation needs, on one device.

target       AR model on the high-resolution grid
drafters     {r: AR model on the grid r times coarser} (MuLo-SD)
draft_model  small AR model on the target's own grid (SD / LANTERN-chain), or None
vq           the VQ tokenizer shared by every resolution
upsamplers   {r: learned token up-sampler}; the pixel up/down-sampler is built from vq
eagle_head   EAGLE's feature-level draft head trained on the target (EAGLE-2, LANTERN), or None;
             ``no_eagle_head`` then says why (the error a request for eagle2 gets)
conditioner  prompt -> condition tensor for every AR model of the family:
             ``check(prompt)`` validates cheaply (raises ValueError), ``(prompt, seed)`` computes
             the condition (seeded where it samples, as Tar's LLM does), ``ignored(prompt)``
             (what of the prompt the condition leaves out: unknown words, characters, truncation),
             ``alias(prompt)`` (the text to condition on instead, e.g. an emoji's name for its
             short name, or None)
defaults     recommended knob values of the family
evaluation   the inputs of the family's quality metrics (``Evaluation``), or None when it has none
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mulo.models.gpt import GPT
from mulo.models.upsample import PixelUpsampler
from mulo.models.vq import VQTokenizer
from mulo.sampling import NeighbourTable


@dataclass(frozen=True)
class Evaluation:
    """What ``mulo.eval.quality.Quality`` needs to score a family's images, with no data set.

    folder   where ``eval_prompts.json`` (the fixed prompt list) and ``eval_reference.npz`` (the
             real images' features and the retrieval texts) are read from; the metrics are off
             while they are missing (a family built before its training wrote them)
    encoder  the text-image model whose feature space the metrics use (twemoji: its mini-CLIP)
    referee  the sprite file of the family's exact referee (``mulo.eval.referee``; emoji scenes),
             which then judges prompt match; None: the encoder's retrieval does
    """

    folder: Path
    encoder: object
    referee: Path | None = None


class Family:
    def __init__(
        self,
        name: str,
        target: GPT,
        drafters: dict[int, GPT],
        vq: VQTokenizer,
        conditioner,
        draft_model: GPT | None = None,
        upsamplers: dict | None = None,
        defaults: dict | None = None,
        evaluation: Evaluation | None = None,
        eagle_head=None,
        no_eagle_head: str | None = None,
        styles: tuple[str, ...] = (),
    ):
        self.name = name
        self.styles = tuple(styles)  # prompt words that ask for one drawing style ("red apple noto")
        self.target = target.eval()
        self.drafters = {r: m.eval() for r, m in drafters.items()}
        self.draft_model = None if draft_model is None else draft_model.eval()
        self.vq = vq
        self.conditioner = conditioner
        self.upsamplers = {r: m.eval() for r, m in (upsamplers or {}).items()}
        self.defaults = dict(defaults or {})  # recommended knob values for this family
        self.evaluation = evaluation
        self.eagle_head = None if eagle_head is None else eagle_head.eval()
        self.no_eagle_head = no_eagle_head
        self._neighbours = NeighbourTable(vq.codebook)
        self._pixel = {}

    @property
    def grid(self) -> tuple[int, int]:
        return self.target.config.grid_hw

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def ratios(self) -> tuple[int, ...]:
        return tuple(sorted(self.drafters))

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def check_prompt(self, prompt: str) -> None:
        """Raise ValueError if the conditioner cannot use ``prompt`` (runs no model)."""
        self.conditioner.check(prompt)

    def condition(self, prompt: str, seed: int = 0) -> torch.Tensor:
        """The condition of ``prompt`` for every AR model (raises ValueError if unusable)."""
        return self.conditioner(prompt, seed).to(self.device)

    def prompt_notes(self, prompt: str) -> list[str]:
        """What of ``prompt`` the condition leaves out, one sentence each (the trace's warnings)."""
        return self.conditioner.ignored(prompt)

    def alias(self, prompt: str) -> str | None:
        """The text the family conditions on instead of ``prompt`` when aliases are on, or None."""
        return self.conditioner.alias(prompt)

    def neighbours(self, k: int) -> torch.Tensor:
        """``[V, k]`` nearest codebook neighbours (computed once per codebook, then sliced)."""
        return self._neighbours.table(k)

    def upsampler(self, kind: str, r: int):
        if kind == "learned":
            if r not in self.upsamplers:
                raise ValueError(f"family {self.name!r} has no learned up-sampler for r={r}")
            return self.upsamplers[r]
        if r not in self._pixel:
            self._pixel[r] = PixelUpsampler(self.vq, r)
        return self._pixel[r]

    def transformers(self) -> list:
        """The AR transformers a request runs (target, drafters, draft model): what compiles and what
        may run wide passes in bf16 (EAGLE's head stays eager)."""
        return [m for m in (self.target, *self.drafters.values(), self.draft_model) if m is not None]

    def to(self, device, dtype: torch.dtype | None = None) -> Family:
        """Every model onto ``device``; the AR models and the EAGLE head also to ``dtype`` (bf16 on
        a GPU: their steps are memory-bound). The tokenizer and up-samplers stay float32."""
        ar_models = [self.target, self.draft_model, self.eagle_head, *self.drafters.values()]
        for model in ar_models:
            if model is not None:
                model.to(device=device, dtype=dtype)
        for model in self.upsamplers.values():
            model.to(device)
        self.vq.model.to(device)
        self._neighbours = NeighbourTable(self.vq.codebook)
        return self
