"""The twemoji family's text-image encoder ("mini-CLIP").

A word-level text transformer and a small image CNN trained contrastively on (emoji image, text).
Its frozen per-word text features condition every AR model of the family (as Tar's TA-Tok
features condition every AR-DTok resolution); its image features serve the quality metrics.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

PAD = "<pad>"


def words(text: str) -> list[str]:
    """Lower-case word tokens: letters/digits runs (``medium-light`` -> ``medium``, ``light``).

    What the word tokenizer reads, and how texts are normalised wherever they are compared
    (emoji names and short prompts in training, aliases, evaluation prompts)."""
    return re.findall(r"[a-z0-9]+", text.lower())


class WordTokenizer:
    """Lower-case words -> ids; id 0 is padding. Unknown words are reported, never silently lost."""

    def __init__(self, vocab: list[str], max_len: int):
        if not vocab or vocab[0] != PAD:
            raise ValueError("the vocabulary must start with the padding token")
        self.vocab = list(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.max_len = max_len

    @classmethod
    def build(cls, texts: list[str], max_len: int) -> WordTokenizer:
        return cls([PAD, *sorted({w for t in texts for w in words(t)})], max_len)

    def split(self, text: str) -> tuple[list[str], list[str]]:
        """(known words, unknown words) of ``text``, in order."""
        found = words(text)
        return [w for w in found if w in self.index], [w for w in found if w not in self.index]

    def encode(self, text: str) -> tuple[torch.Tensor, list[str]]:
        """``[max_len]`` ids (known words, truncated, padded) and the unknown words."""
        known, unknown = self.split(text)
        ids = [self.index[w] for w in known][: self.max_len]
        return torch.tensor(ids + [0] * (self.max_len - len(ids))), unknown

    def batch(self, texts: list[str]) -> torch.Tensor:
        return torch.stack([self.encode(t)[0] for t in texts])


class TextEncoder(nn.Module):
    def __init__(
        self, vocab_size: int, max_len: int, width: int = 128, layers: int = 2, heads: int = 4, embed: int = 128
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, width, padding_idx=0)
        self.positions = nn.Parameter(torch.zeros(max_len, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.project = nn.Linear(width, embed)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids [B, L]`` -> (per-word features ``[B, L, width]`` with padding zeroed, embedding ``[B, embed]``)."""
        pad = ids == 0
        h = self.tokens(ids) + self.positions[: ids.shape[1]]
        h = self.norm(self.encoder(h, src_key_padding_mask=pad))
        h = h.masked_fill(pad[..., None], 0.0)
        pooled = h.sum(1) / (~pad).sum(1, keepdim=True).clamp_min(1)
        return h, F.normalize(self.project(pooled), dim=-1)


IMAGE_PX = 64  # the mini-CLIP's image size; larger images (the 128 px family's) are area-resized to it


class ImageEncoder(nn.Module):
    """64 px (or any multiple of 16) RGB in [0, 1] -> normalised embedding."""

    def __init__(self, width: int = 64, embed: int = 128):
        super().__init__()
        chans = [3, width // 2, width, 2 * width, 2 * width]
        blocks = []
        for cin, cout in zip(chans[:-1], chans[1:], strict=True):
            blocks += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.GroupNorm(8, cout), nn.SiLU()]
            blocks += [nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU()]
        self.net = nn.Sequential(*blocks)
        self.project = nn.Linear(2 * width, embed)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled pre-projection features ``[B, 2*width]`` (the FD metric's space)."""
        if images.shape[-1] > IMAGE_PX:
            images = F.interpolate(images, size=(IMAGE_PX, IMAGE_PX), mode="area")
        return self.net(images * 2 - 1).mean((2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.project(self.features(images)), dim=-1)


class MiniCLIP(nn.Module):
    def __init__(self, vocab: list[str], max_len: int = 16, width: int = 128, embed: int = 128, image_width: int = 64):
        super().__init__()
        self.config = dict(max_len=max_len, width=width, embed=embed, image_width=image_width)
        self.tokenizer = WordTokenizer(vocab, max_len)
        self.text = TextEncoder(len(vocab), max_len, width, embed=embed)
        self.image = ImageEncoder(image_width, embed)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))  # log(1/0.07), as in CLIP

    @property
    def cond_dim(self) -> int:
        return self.config["width"]

    def loss(self, images: torch.Tensor, ids: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        """Symmetric InfoNCE; ``same [B, B]`` marks pairs of the same emoji (all positives)."""
        img = self.image(images)
        _, txt = self.text(ids)
        logits = self.logit_scale.exp().clamp(max=100) * img @ txt.T
        target = same.float() / same.float().sum(1, keepdim=True)
        return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target.T))

    @property
    def cond_len(self) -> int:
        return self.config["max_len"] + 1

    @torch.no_grad()
    def condition_features(self, ids: torch.Tensor) -> torch.Tensor:
        """AR conditions ``[B, max_len + 1, width]`` of word ids ``[B, max_len]``.

        Slot 0 holds the contrastive text embedding (the part trained to pick out one image),
        the other slots the per-word features; every non-padding slot is scaled to unit RMS.
        Why: the raw word features of the trained v0 mini-CLIP had a mean magnitude of 0.05-0.15
        per component, close to the all-zero null condition, and the v0 target learned to ignore them.
        """
        if self.config["embed"] != self.config["width"]:
            raise ValueError("condition_features needs embed == width")
        words, pooled = self.text(ids)
        features = torch.cat([pooled[:, None], F.normalize(words, dim=-1)], dim=1)
        return features * self.config["width"] ** 0.5  # padding slots stay exactly zero

    def check_prompt(self, prompt: str) -> tuple[torch.Tensor, list[str]]:
        """Word ids and unknown words of ``prompt``; ValueError when no word is known."""
        ids, unknown = self.tokenizer.encode(prompt)
        if not bool((ids > 0).any()):
            if not unknown:  # emoji, punctuation, accents only: nothing the word tokenizer reads
                raise ValueError(
                    f"no known word in the prompt {prompt!r}: this family reads words of letters a-z and digits"
                )
            raise ValueError(f"no known word in the prompt {prompt!r} (unknown: {', '.join(unknown)})")
        return ids, unknown

    @torch.no_grad()
    def condition(self, prompt: str) -> tuple[torch.Tensor, list[str]]:
        """AR condition ``[cond_len, width]`` of a prompt, and its unknown words.

        Raises ValueError when no word of the prompt is known."""
        ids, unknown = self.check_prompt(prompt)
        return self.condition_features(ids[None].to(self.logit_scale.device))[0], unknown

    @torch.no_grad()
    def embed_texts(self, texts: list[str], batch: int = 512) -> torch.Tensor:
        device = self.logit_scale.device
        return torch.cat(
            [self.text(self.tokenizer.batch(texts[i : i + batch]).to(device))[1] for i in range(0, len(texts), batch)]
        )

    @torch.no_grad()
    def embed_images(self, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
        device = self.logit_scale.device
        return torch.cat([self.image(images[i : i + batch].to(device)) for i in range(0, len(images), batch)])
