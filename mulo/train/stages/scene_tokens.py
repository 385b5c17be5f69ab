"""Fresh training scenes for the scenes family's AR, up-sampler and EAGLE stages (issue 63).

Training scene i of the run's stream (``Pipeline.scene_stream``, never exhausted) is rendered and
encoded by the run's VQ at the three sizes, in chunks of ``budget.scene_chunk`` scenes written to
``run/scenes/chunk-NNNNN.npz`` with their three texts, by the stage whose batch first reaches
them (the budget's stages read ``planned`` scenes; the tokens stage encodes none, so a run resumed
on a new machine encodes only what is left to read). A stage's step s reads the scenes
[s * B, (s + 1) * B) of its batch size B: every step sees scenes no step saw before, never a
held-out combination (the stream's training split), and a resumed stage reads what an
uninterrupted one would have. Only the chunks a batch touches are in memory: 160,000 scenes are
430 MB of tokens on disk, 24 GB as images.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from mulo.train.data import to_float
from mulo.train.scenes import TRAIN, describe

log = logging.getLogger(__name__)

RENDER_BATCH = 256  # scenes rendered and encoded at once inside a chunk


def planned(budget) -> int:
    """Training scenes the budget's stages read: each stage's steps times its batch, the largest."""
    return max(
        budget.ar_steps * budget.ar_batch,
        budget.drafter_steps * budget.ar_batch,
        budget.draft_model_steps * budget.ar_batch,
        budget.eagle_steps * budget.eagle_batch,
        budget.upsampler_steps * budget.upsampler_batch,
    )


class SceneTokens:
    """The run's encoded training scenes, by index (``rows``), encoding missing chunks on demand."""

    def __init__(self, pipe, tokenizer=None):
        self.pipe, self.chunk = pipe, pipe.budget.scene_chunk
        self.folder = pipe.run / "scenes"
        self._tokenizer = tokenizer
        self._loaded: dict[int, dict] = {}  # the chunks the last batch touched

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self.pipe.tokenizer()
        return self._tokenizer

    def path(self, chunk: int):
        return self.folder / f"chunk-{self.chunk}-{chunk:05d}.npz"

    def ensure(self, count: int) -> None:
        """Every chunk of the first ``count`` training scenes on disk."""
        chunks = -(-count // self.chunk)
        for chunk in range(chunks):
            if not self.path(chunk).exists():
                self.encode(chunk)
                if chunk % 10 == 9 or chunk + 1 == chunks:
                    log.info("scene tokens: chunk %d of %d", chunk + 1, chunks)

    @torch.no_grad()
    def encode(self, chunk: int) -> None:
        pipe, stream = self.pipe, self.pipe.scene_stream
        scenes = stream.scenes(chunk * self.chunk, self.chunk, TRAIN)
        grids = {px: [] for px in pipe.recipe.sizes}
        for start in range(0, len(scenes), RENDER_BATCH):
            rendered = [stream.render(s) for s in scenes[start : start + RENDER_BATCH]]
            for px in grids:
                images = to_float(np.stack([r[px] for r in rendered])).to(pipe.device)
                grids[px].append(self.tokenizer.encode(images).cpu().numpy().astype(np.int16))
        texts = [describe(s) for s in scenes]
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path(chunk).with_suffix(".tmp.npz")
        np.savez(
            tmp,
            **{f"tokens{px}": np.concatenate(parts) for px, parts in grids.items()},
            name=np.array([t[0] for t in texts]),
            description=np.array([t[1] for t in texts]),
            short=np.array([t[2][0] for t in texts]),
        )
        tmp.replace(self.path(chunk))

    def load(self, chunk: int) -> dict:
        if chunk not in self._loaded:
            if not self.path(chunk).exists():
                self.encode(chunk)
            with np.load(self.path(chunk)) as z:
                self._loaded = {**{k: v for k, v in self._loaded.items() if k == chunk - 1}, chunk: dict(z)}
        return self._loaded[chunk]

    def rows(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Training scenes [start, start + count): ``tokens{px}`` (int16) at each size and their
        ``name`` (the prompt), ``description`` and ``short`` (the prompt without background) texts."""
        parts = []
        index = start
        while index < start + count:
            chunk, offset = divmod(index, self.chunk)
            take = min(self.chunk - offset, start + count - index)
            arrays = self.load(chunk)
            parts.append({k: v[offset : offset + take] for k, v in arrays.items()})
            index += take
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
