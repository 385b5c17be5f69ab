"""The ``upsampler_r2`` and ``upsampler_r4`` stages of the emoji families' training
(``mulo.train.pipeline.Pipeline``): learned token up-samplers (``mulo.models.upsample``) from the
px / r encoding of an image to its px encoding."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mulo.models.upsample import TokenUpsampler
from mulo.train.loop import train
from mulo.train.stages.ar import background_mask, background_sample, weighted_cross_entropy

# A "block" up-sampler's steps whose low-res grid is cut at a random row, as a drafted block that
# ends above the image's bottom gives it: the default drafts the whole image, so most steps do too.
TRUNCATED_SHARE = 0.25


def stage_upsampler(pipe, r: int) -> None:
    z = np.load(pipe.run / "tokens.npz")
    px, hyper = pipe.recipe.px, pipe.recipe.hyper
    high = torch.from_numpy(z[f"tokens{px}"].astype(np.int64))
    low = torch.from_numpy(z[f"tokens{px // r}"].astype(np.int64))
    is_val = z["is_val"]
    source = z["source"] if "source" in z.files else np.arange(len(is_val))
    torch.manual_seed(pipe.seed + r)
    up = TokenUpsampler(
        pipe.codes, r, width=hyper.upsampler_width, depth=hyper.upsampler_depth, context=hyper.upsampler_context
    ).to(pipe.device)
    train_idx = np.flatnonzero(~is_val[source])  # augmented copies train too
    rng = pipe.rng(f"upsampler_r{r}")

    fresh = None
    if pipe.recipe.scenes:  # fresh scenes each step (``scene_tokens``), not the data stage's few
        from mulo.train.stages.scene_tokens import SceneTokens

        fresh, side = SceneTokens(pipe), px // pipe.recipe.patch

    def loss_fn(step):
        if fresh is not None:
            b = pipe.budget.upsampler_batch
            rows = fresh.rows(step * b, b)
            pair = [torch.from_numpy(rows[f"tokens{size}"].astype(np.int64)) for size in (px // r, px)]
            low_batch, high_batch = pair[0].reshape(b, side // r, side // r), pair[1].reshape(b, side, side)
            low_batch, high_batch = low_batch.to(pipe.device), high_batch.to(pipe.device)
            step_rng = np.random.default_rng([pipe.seed, r, step])  # a resumed stage draws the same
            low_batch, high_batch = block_cut(low_batch, high_batch, step_rng)
            share = pipe.budget.background_loss_share
            if share < 1.0:  # the head on every object token and a weighted share of the background's
                weights = background_sample(high_batch.reshape(b, -1), share, step_rng)
                features = up.features(low_batch).permute(0, 2, 3, 1).reshape(-1, up.head.in_channels)
                return weighted_cross_entropy(up.head_rows, features, high_batch, weights)
            return F.cross_entropy(up(low_batch), high_batch)
        idx = rng.choice(train_idx, size=min(pipe.budget.upsampler_batch, len(train_idx)), replace=False)
        low_batch, high_batch = low[idx].to(pipe.device), high[idx].to(pipe.device)
        low_batch, high_batch = block_cut(low_batch, high_batch, np.random.default_rng([pipe.seed, r, step]))
        return F.cross_entropy(up(low_batch), high_batch)

    def block_cut(low_batch, high_batch, step_rng):
        """A "block" up-sampler's batch, at ``TRUNCATED_SHARE`` of the steps cut at a random low-res
        row: a block that ends above the image's bottom does not give the rows below it."""
        if up.config["context"] != "block" or step_rng.random() >= TRUNCATED_SHARE:
            return low_batch, high_batch
        cut = int(step_rng.integers(1, low_batch.shape[1]))
        return low_batch[:, :cut], high_batch[:, : cut * r]

    stats = train(
        f"upsampler_r{r}",
        up,
        loss_fn,
        pipe.budget.upsampler_steps,
        pipe.run / f"upsampler_r{r}.ckpt",
        lr=hyper.upsampler_lr,
        every=pipe.budget.checkpoint_every,
    )
    with torch.no_grad():
        val = np.flatnonzero(is_val)
        pred = torch.cat([up(low[val[i : i + 64]].to(pipe.device)).argmax(1).cpu() for i in range(0, len(val), 64)])
        right = pred == high[val]
        objects = ~background_mask(high[val].flatten(1)).reshape(right.shape)
    torch.save(up.state_dict(), pipe.run / f"upsampler_r{r}.pt")
    # object cells apart: the background, ~85 % of a scene, is right almost always
    pipe.record(
        f"upsampler_r{r}",
        **stats,
        val_token_accuracy=round(float(right.float().mean()), 4),
        val_object_accuracy=round(float(right[objects].float().mean()), 4),
    )
