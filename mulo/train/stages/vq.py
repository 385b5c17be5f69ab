"""The VQ stage of the emoji families' training (``mulo.train.pipeline.Pipeline``): one VQ per
candidate codebook size (a trained ``diffusers.VQModel``, or for the scenes a k-means codebook of
pixel squares, ``mulo.models.patch_vq``), its reconstruction quality and, with several candidates,
the oracle MuLo-SD that ``recipes.choose_codebook`` picks the family's codebook by."""

from __future__ import annotations

import shutil
import time

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel

from mulo.models.patch_vq import PatchCodebook, fit_codebook, image_squares
from mulo.models.vq import build_model, codes_in, draw, read
from mulo.train.loop import train
from mulo.train.recipes import choose_codebook, vq_config

QUALITY_CHUNK = 256  # validation images per VQ call in ``vq_quality``
FLAT_SPREAD = 1 / 255  # a square whose channels vary less than this is one flat colour


def stage_vq(pipe) -> None:
    """One VQ per candidate codebook size; with several, the oracle MuLo-SD of each goes into
    the report (``vq_study``) and ``choose_codebook`` picks the family's."""
    if pipe.vq_from is not None:
        return adopt_vq(pipe)
    candidates = pipe.recipe.vq_codes
    study = pipe.report.get("vq_study", {}).get("candidates", {})
    for codes in candidates:
        name = "vq" if len(candidates) == 1 else f"vq_{codes}"
        if str(codes) in study and (pipe.run / f"{name}.pt").exists():
            continue
        vq, stats = train_vq(pipe, codes, name)
        torch.save(vq.state_dict(), pipe.run / f"{name}.pt")
        quality = vq_quality(pipe, vq)
        if pipe.recipe.scenes:  # the referee must still read the scenes through this VQ (>= 98 %)
            quality["val_referee_match"] = referee_match(pipe, vq)
        if len(candidates) > 1:
            quality["oracle"] = oracle(pipe, vq)
        study[str(codes)] = {**stats, **quality}
        if len(candidates) > 1:
            pipe.record("vq_study", candidates=study)
    chosen = choose_codebook(study) if len(candidates) > 1 else candidates[0]
    if len(candidates) > 1:
        shutil.copyfile(pipe.run / f"vq_{chosen}.pt", pipe.run / "vq.pt")
    summary = {k: v for k, v in study[str(chosen)].items() if k != "oracle"}
    pipe.record("vq", codes=chosen, **summary)


def adopt_vq(pipe) -> None:
    """The VQ trained elsewhere (``train --vq FILE``) as the family's, judged like a trained one:
    runs that should differ only in what comes after the VQ share one this way."""
    vq = load_foreign_vq(pipe.recipe, pipe.vq_from)
    torch.save(vq.state_dict(), pipe.run / "vq.pt")
    vq = vq.to(pipe.device).eval()
    quality = vq_quality(pipe, vq)
    if pipe.recipe.scenes:
        quality["val_referee_match"] = referee_match(pipe, vq)
    pipe.record("vq", codes=codes_in(vq.state_dict()), adopted_from=str(pipe.vq_from), **quality)


def load_foreign_vq(recipe, source) -> VQModel | PatchCodebook:
    """``source``'s weights in a VQ of ``recipe``'s kind and architecture (any codebook size), or a
    ValueError that says why not (``train --vq`` checks its file with this before training)."""
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
        codes = codes_in(state)
    except Exception as exc:  # not a torch file, or not a VQ's state dict
        raise ValueError(f"--vq {source}: not the weights of a VQ ({type(exc).__name__})") from exc
    vq = build_model(vq_config(codes, recipe.patch, **recipe.vq_model))
    own = vq.state_dict()
    if set(state) != set(own) or any(state[k].shape != v.shape for k, v in own.items()):
        raise ValueError(f"--vq {source}: not a VQ of the {recipe.family} recipe's architecture")
    vq.load_state_dict(state)
    return vq


def train_vq(pipe, codes: int, name: str) -> tuple[VQModel | PatchCodebook, dict]:
    if pipe.recipe.vq_model.get("kind") == "patches":
        return fit_patch_vq(pipe, codes)
    torch.manual_seed(pipe.seed)
    vq = VQModel(**pipe.vq_config(codes)).to(pipe.device)
    train_idx = np.flatnonzero(~pipe.data.is_val)
    images = [pipe.images_at(px, train_idx) for px in pipe.recipe.sizes]
    b, hyper = pipe.budget.vq_batch, pipe.recipe.hyper
    windows = Windows(images, pipe.rng("vq"), hyper.vq_crop, hyper.vq_tile, hyper.vq_busy, pipe.recipe.patch)
    stats = fit_vq(
        name, vq, windows, 3 * b, pipe.budget.vq_steps, pipe.run / f"{name}.ckpt", hyper, pipe.budget.checkpoint_every
    )
    return vq.eval(), stats


def fit_patch_vq(pipe, codes: int) -> tuple[PatchCodebook, dict]:
    """A codebook of pixel squares (``mulo.models.patch_vq``): k-means over ``Hyper.patch_squares``
    squares drawn alike from every square of the training images at the three sizes, ``vq_busy``
    of them not one flat colour: flat squares are most of a scene and a handful of codes draws
    them all."""
    start = time.perf_counter()
    hyper, rng = pipe.recipe.hyper, pipe.rng("vq")
    train_idx = np.flatnonzero(~pipe.data.is_val)
    squares = torch.cat([image_squares(pipe.images_at(px, train_idx), pipe.recipe.patch) for px in pipe.recipe.sizes])
    flat = squares.reshape(len(squares), 3, -1).std(dim=2).amax(dim=1) < FLAT_SPREAD
    busy_idx, flat_idx = torch.nonzero(~flat)[:, 0].numpy(), torch.nonzero(flat)[:, 0].numpy()
    want = min(len(busy_idx), round(hyper.patch_squares * hyper.vq_busy))
    picked = np.concatenate(
        [
            rng.choice(busy_idx, size=want, replace=False),
            rng.choice(flat_idx, size=min(len(flat_idx), hyper.patch_squares - want), replace=False),
        ]
    )
    generator = torch.Generator().manual_seed(pipe.seed)
    book = PatchCodebook(codes, pipe.recipe.patch)
    book.squares = fit_codebook(squares[picked].to(pipe.device), codes, hyper.patch_iterations, generator)
    seconds = round(time.perf_counter() - start, 1)
    stats = {"seconds": seconds, "squares": len(picked), "busy_squares": want, "iterations": hyper.patch_iterations}
    return book.eval(), stats


class Windows:
    """What a VQ training step reads at each size: whole images, or random ``crop`` px crops of
    those above it; for a tiled VQ (``tile``), ``tile`` px windows on the token grid (at inference
    its tiles sit on that grid too), a ``busy`` share of them among those that hold more than flat
    background, and windows spread over the sizes as the tiles each size holds (16 : 4 : 1 at 128,
    64, 32 px with 32 px tiles), so each size is learnt as often as it is read."""

    def __init__(self, images: list[torch.Tensor], rng, crop: int, tile: int = 0, busy: float = 0.0, grid: int = 4):
        self.images, self.rng, self.crop, self.tile, self.busy, self.grid = images, rng, crop, tile, busy, grid
        share = np.array([(x.shape[-1] // tile) ** 2 if tile else 1 for x in images], dtype=float)
        self.share = share / share.sum()

    def counts(self, batch: int) -> list[int]:
        """Windows per size in a step of ``batch``: a draw by the shares (tiled), else equal parts."""
        if self.tile:
            return [int(n) for n in self.rng.multinomial(batch, self.share)]
        return [batch // len(self.images)] * len(self.images)

    def draw(self, size: int, count: int) -> torch.Tensor:
        images, rng = self.images[size], self.rng
        side = images.shape[-1]
        if not self.tile:
            batch = images[rng.choice(len(images), size=count, replace=len(images) < count)]
            if side > self.crop:  # one crop for the batch: the net is convolutional
                top, left = rng.integers(0, side - self.crop + 1, size=2)
                batch = batch[:, :, top : top + self.crop, left : left + self.crop]
            return batch
        idx = rng.integers(0, len(images), size=count * (4 if self.busy else 1))
        if side <= self.tile:
            return images[idx[:count]]
        corners = np.arange(0, side - self.tile + 1, self.grid)
        tops, lefts = rng.choice(corners, size=len(idx)), rng.choice(corners, size=len(idx))
        t = self.tile
        crops = torch.stack([images[i, :, y : y + t, x : x + t] for i, y, x in zip(idx, tops, lefts, strict=True)])
        if not self.busy:
            return crops
        spread = crops.flatten(2).std(dim=2).mean(dim=1)  # ~0 for a window of flat background
        busy, flat = (spread > 0.02).nonzero()[:, 0], (spread <= 0.02).nonzero()[:, 0]
        wanted = min(len(busy), round(count * self.busy))
        pick = torch.cat([busy[:wanted], flat[: count - wanted]])
        pick = torch.cat([pick, busy[wanted : wanted + count - len(pick)]])  # too few flat ones: more busy
        return crops[pick]


def fit_vq(name: str, vq: VQModel, windows: Windows, batch: int, steps: int, checkpoint, hyper, every, on_step=None):
    """Train ``vq`` on ``windows`` (``batch`` a step): MSE + ``hyper.vq_l1_weight`` L1 +
    commitment; codes no batch has used for about ``hyper.vq_restart_every`` steps move to random
    current encoder outputs. ``on_step(step)`` runs after each step (an evaluation). Resumable:
    ``loop.train``'s checkpoint."""
    device = vq.quantize.embedding.weight.device
    codes = vq.quantize.embedding.weight.shape[0]
    recent = {}  # the largest size's last encoder outputs and codes, for dead-code restarts
    usage = torch.zeros(codes, device=device)

    def loss_fn(step):
        total = 0.0
        for size, count in enumerate(windows.counts(batch)):
            if not count:
                continue
            x = windows.draw(size, count).to(device) * 2 - 1
            latents = read(vq, x)
            quant, commit_loss, (_, _, used) = vq.quantize(latents)
            recon = draw(vq, quant)
            loss = F.mse_loss(recon, x) + hyper.vq_l1_weight * F.l1_loss(recon, x) + commit_loss
            # tiled: each size by its share of the windows; else the sizes' losses summed, as ever
            total = total + (loss * count / batch if windows.tile else loss)
            if size == 0:
                recent.update(latents=latents.detach(), codes=used.detach())
        return total

    def restart_dead_codes(step):
        # (no codes yet when a tiled step's draw left the largest size out from the first step)
        with torch.no_grad():
            if recent:
                used = recent["codes"].reshape(-1)
                usage.mul_(0.99).index_add_(0, used, torch.ones(used.numel(), device=device))
                dead = (usage < 0.05).nonzero()[:, 0] if (step + 1) % hyper.vq_restart_every == 0 else []
                if len(dead):
                    lat = recent["latents"].permute(0, 2, 3, 1).reshape(-1, recent["latents"].shape[1])
                    vq.quantize.embedding.weight[dead] = lat[torch.randint(len(lat), (len(dead),), device=device)]
                    usage[dead] = 1.0
        if on_step is not None:
            on_step(step)

    return train(name, vq, loss_fn, steps, checkpoint, lr=hyper.vq_lr, every=every, on_step=restart_dead_codes)


@torch.no_grad()
def vq_quality(pipe, vq) -> dict:
    from mulo.eval.ceilings import upsampling_agreement
    from mulo.models.upsample import PixelUpsampler

    tok = pipe.tokenizer(vq=vq.eval())
    val = np.flatnonzero(pipe.data.is_val)
    # in chunks of images: the whole validation split at 128 px through the VQ at once takes tens of GB
    chunks = [val[i : i + QUALITY_CHUNK] for i in range(0, len(val), QUALITY_CHUNK)]
    out = {}
    for size in pipe.recipe.sizes:
        squared, used = 0.0, set()
        for chunk in chunks:
            x = pipe.images_at(size, chunk).to(pipe.device)
            codes = tok.encode(x)
            squared += float(((tok.decode(codes) - x) ** 2).sum())
            used.update(codes.unique().tolist())
        mse = squared / (len(val) * 3 * size * size)
        out[f"val_psnr_{size}px"] = round(10 * np.log10(1 / max(mse, 1e-10)), 2)
        out[f"codes_used_{size}px"] = len(used)
    # What a perfect drafter could get accepted at k = 0: the share of the target's codes that
    # the pixel up-sampler (whole image at once) reproduces from the px / r encoding, and, for
    # comparison, from the px / r image itself with no low-res VQ (every image has as many codes,
    # so a share over the split is the mean of the chunks' shares weighted by their sizes).
    for r in (2, 4):
        upsampler, shares = PixelUpsampler(tok, r), {"from_tokens": 0.0, "from_pixels": 0.0}
        for chunk in chunks:
            part = upsampling_agreement(tok, upsampler, pipe.images_at(pipe.recipe.px, chunk), r)
            for key in shares:
                shares[key] += part[key] * len(chunk) / len(val)
        out[f"val_draft_agreement_r{r}"] = round(shares["from_tokens"], 4)
        out[f"val_resize_agreement_r{r}"] = round(shares["from_pixels"], 4)
    return out


@torch.no_grad()
def referee_match(pipe, vq) -> float:
    """Share of the held-out scenes whose reconstruction by ``vq`` at the target's size the
    family's referee (``mulo.eval.referee``) finds to match their prompts: what an AR model of
    this tokenizer can reach at best (the real scenes score 1)."""
    from mulo.eval.referee import Referee

    tok, d = pipe.tokenizer(vq=vq.eval()), pipe.data
    referee = Referee(pipe.scene_stream.sheet.subset(pipe.recipe.scenes.names))
    val = np.flatnonzero(d.is_val)
    matched = 0
    for i in range(0, len(val), QUALITY_CHUNK):
        chunk = val[i : i + QUALITY_CHUNK]
        x = pipe.images_at(pipe.recipe.px, chunk).to(pipe.device)
        recon = (tok.decode(tok.encode(x)).clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        matched += sum(referee.prompt_match(image, d.names[j]).match for image, j in zip(recon, chunk, strict=True))
    return round(matched / len(val), 4)


def oracle(pipe, vq) -> list[dict]:
    """The oracle MuLo-SD table (``mulo.eval.ceilings.oracle_table``) of ``vq`` on validation emoji."""
    from mulo.eval.ceilings import oracle_table

    rows = oracle_table(pipe.tokenizer(vq=vq.eval()), pipe.data.val.scales, pipe.budget.oracle_images, pipe.recipe.px)
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows]
