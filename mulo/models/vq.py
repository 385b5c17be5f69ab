"""Token-level interface to a VQ image tokenizer (a ``diffusers.VQModel``).

One tokenizer serves every resolution of a family: a 64 px image becomes a 16x16 grid at 4x
downsampling and a 32 px image an 8x8 grid, which is what makes token up/down-sampling and
codebook-neighbour pooling meaningful between drafter and target.

A tokenizer with a ``tile`` reads and draws an image as independent ``tile``-pixel squares (the
emoji scenes' VQ: it trained on such windows, and diffusers' VQModel normalises with GroupNorm
over whatever it is given, so a whole 128 px scene, mostly flat background, is not what it
learnt; benchmarks/scenes-vq-probe.json). A token then depends on its own tile only, and a
changed token redraws its own tile only.

A *folded* VQ (``in_channels`` 3 f^2) reads each f x f square of pixels as one position of
3 f^2 channels (``pixel_unshuffle``) and draws them back (``pixel_shuffle``): with f = 4 its
convolutions all run at the token grid, as wide as the finest layer of an unfolded one costs,
and its last layer writes each token's 4 x 4 pixels directly, where an unfolded decoder must
learn them through nearest-neighbour up-sampling (the scenes' VQ; benchmarks/scenes-vq-study.json).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mulo.models.patch_vq import PatchCodebook, image_squares

if TYPE_CHECKING:  # importing diffusers takes seconds: a family of pixel squares never needs it
    from diffusers import VQModel


class Tokenizer:
    """Images in [0, 1] ``[B, 3, h, w]`` <-> token grids ``[B, H, W]`` (int64) through a codebook:
    what both kinds of VQ share (``codebook`` is each kind's own)."""

    codebook: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.codebook.shape[0]

    @property
    def device(self) -> torch.device:
        return self.codebook.device


class VQTokenizer(Tokenizer):
    """A ``diffusers.VQModel``'s tokenizer, whole images or tiles."""

    def __init__(self, model: VQModel, tile: int = 0):
        self.model = model.eval()
        self.downsample = pixels_per_token(model)
        if tile and tile % self.downsample:
            raise ValueError(f"a VQ tile of {tile} px is not a multiple of its downsampling {self.downsample}")
        self.tile = tile  # px; 0: whole images

    @property
    def codebook(self) -> torch.Tensor:
        return self.model.quantize.embedding.weight

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        b, h, w = tokens.shape
        side = self.tile // self.downsample  # tokens a tile
        tiles = split(tokens.unsqueeze(1), side).squeeze(1)
        dim = self.codebook.shape[1]
        latents = self.model.quantize.get_codebook_entry(
            tiles.to(self.codebook.device).reshape(-1), (*tiles.shape, dim)
        )
        pixels = draw(self.model, latents.to(self.codebook.dtype))
        pixels = join(pixels, b, h * self.downsample, w * self.downsample)
        return (pixels.float() * 0.5 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        b, _, h, w = images.shape
        if h % self.downsample or w % self.downsample:
            raise ValueError(f"image size {h}x{w} is not a multiple of the VQ downsampling {self.downsample}")
        tiles = split(images * 2 - 1, self.tile)
        latents = read(self.model, tiles.to(self.codebook.device, self.codebook.dtype))
        _, _, (_, _, indices) = self.model.quantize(latents)
        grid = indices.reshape(latents.shape[0], 1, latents.shape[2], latents.shape[3])
        return join(grid, b, h // self.downsample, w // self.downsample).squeeze(1)


class PatchTokenizer(Tokenizer):
    """A codebook of pixel squares' tokenizer (``mulo.models.patch_vq``): a token is the nearest
    square and draws exactly that square."""

    def __init__(self, model: PatchCodebook):
        self.model = model.eval()
        self.downsample = model.patch
        self.tile = model.patch  # px: what a token's pixels depend on

    @property
    def codebook(self) -> torch.Tensor:
        return self.model.squares

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        b, _, h, w = images.shape
        p = self.downsample
        if h % p or w % p:
            raise ValueError(f"image size {h}x{w} is not a multiple of the VQ downsampling {p}")
        squares = image_squares(images.to(self.device, self.codebook.dtype), p)
        return self.model.nearest(squares).reshape(b, h // p, w // p)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        squares = self.codebook[tokens.to(self.device)]  # [B, H, W, 3 p^2]
        return F.pixel_shuffle(squares.permute(0, 3, 1, 2), self.downsample).float().clamp(0, 1)


def build_model(config: dict) -> VQModel | PatchCodebook:
    """The VQ of an exported or recipe config: a ``VQModel`` (its arguments), or a codebook of
    pixel squares (``{"kind": "patches", "patch": p, "codes": n}``)."""
    if config.get("kind") == "patches":
        return PatchCodebook(config["codes"], config["patch"])
    from diffusers import VQModel

    return VQModel(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k != "tile"})


def make_tokenizer(model: VQModel | PatchCodebook, tile: int = 0) -> VQTokenizer | PatchTokenizer:
    return PatchTokenizer(model) if isinstance(model, PatchCodebook) else VQTokenizer(model, tile)


def codes_in(state: dict) -> int:
    """The codebook size of a VQ's state dict (either kind)."""
    book = state["squares"] if "squares" in state else state["quantize.embedding.weight"]
    return int(book.shape[0])


def folded(model: VQModel) -> int:
    """f: the side of the pixel squares a folded VQ reads as one position (1: not folded)."""
    return round((model.config.in_channels / 3) ** 0.5)


def pixels_per_token(model: VQModel) -> int:
    return folded(model) * 2 ** (len(model.config.block_out_channels) - 1)


def read(model: VQModel, images: torch.Tensor) -> torch.Tensor:
    """Images in [-1, 1] -> the encoder's latents (before quantisation)."""
    f = folded(model)
    return model.encode(F.pixel_unshuffle(images, f) if f > 1 else images).latents


def draw(model: VQModel, latents: torch.Tensor) -> torch.Tensor:
    """Quantised latents -> images in about [-1, 1]."""
    f = folded(model)
    pixels = model.decode(latents, force_not_quantize=True).sample
    return F.pixel_shuffle(pixels, f) if f > 1 else pixels


def split(x: torch.Tensor, tile: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B * (H / tile) * (W / tile), C, tile, tile]``, tiles row-major per
    image; as it is when ``tile`` is 0 or the image fits in one."""
    b, c, h, w = x.shape
    if not tile or (h <= tile and w <= tile):
        return x
    if h % tile or w % tile:
        raise ValueError(f"a {h}x{w} grid does not split into {tile}x{tile} tiles")
    return x.reshape(b, c, h // tile, tile, w // tile, tile).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, tile, tile)


def join(tiles: torch.Tensor, b: int, h: int, w: int) -> torch.Tensor:
    """``split``'s inverse: ``b`` images ``h`` x ``w`` from their tiles."""
    _, c, th, tw = tiles.shape
    if (th, tw) == (h, w):
        return tiles
    x = tiles.reshape(b, h // th, w // tw, c, th, tw).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, h, w)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, h, w]`` floats in [0, 1] -> ``[B, h, w, 3]`` uint8 (rounded)."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
