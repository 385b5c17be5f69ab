"""The AR stages of the emoji families' training (``mulo.train.pipeline.Pipeline``): the target, the
r = 2 and r = 4 drafters and the same-grid draft model, each a GPT trained on the tokens stage's
token grids and text conditions. ``ar_data`` and ``ar_batch`` also feed the EAGLE stage."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from mulo.methods.zipar import proxied_targets, training_inputs, training_mask
from mulo.models.gpt import GPT, GPTConfig
from mulo.train import styles
from mulo.train.loop import autocast, init_weights, train
from mulo.train.recipes import CFG_DROPOUT, COND_LEN

VALIDATION_IMAGES = 512  # held-out images the AR stages' model selection scores (a fixed subset)
MEASURED_WINDOWS = (4, 8)  # ZipAR windows whose teacher-forced loss the report gives


def stage_ar(pipe, stage: str) -> None:
    """Train ``stage`` (``target``, ``drafter_r2``, ``drafter_r4`` or ``draft_model``), then
    measure its losses on the kept weights and save it with its config."""
    side = pipe.recipe.grid(stage)
    data = ar_data(pipe, side)
    config = pipe.recipe.gpt_config(stage, pipe.codes, data.cond_name.shape[-1])
    torch.manual_seed(pipe.seed + side)
    model = GPT(config)
    model.apply(init_weights)
    init_positions(model, pipe.recipe.hyper.pe_init)
    if pipe.recipe.hyper.embed_init == "pixels":
        vq = torch.load(pipe.run / "vq.pt", map_location="cpu", weights_only=True)
        if "squares" not in vq:
            raise ValueError("embed_init 'pixels' needs a codebook of squares; this run's VQ is a network")
        init_from_pixels(model, vq["squares"])
    model.to(pipe.device)
    steps = stage_steps(pipe.budget, stage)
    # Held-out losses, conditioned on what names the image best: the name with its style word
    # on styled data (a held-out pair is an unseen (emoji, style) combination), else the name.
    cond = getattr(data, "cond_name_style", data.cond_name)
    groups = held_out(pipe, data)
    selection = groups["val"][:VALIDATION_IMAGES]

    def validate() -> float:
        return validation_loss(model, data.tokens[selection], cond[selection], pipe.device)

    hyper = pipe.recipe.hyper
    stats = train(
        stage,
        model,
        ar_loss(pipe, stage, model, data, steps),
        steps,
        pipe.run / f"{stage}.ckpt",
        lr=hyper.ar_lr if stage != "draft_model" else hyper.draft_model_lr,
        weight_decay=pipe.budget.weight_decay,
        every=pipe.budget.checkpoint_every,
        validate=validate if pipe.budget.validate_every else None,
        validate_every=pipe.budget.validate_every,
    )
    losses = measured_losses(pipe, stage, model, data.tokens, cond, groups)
    torch.save(model.state_dict(), pipe.run / f"{stage}.pt")
    (pipe.run / f"{stage}.json").write_text(json.dumps(asdict(config)))
    pipe.record(stage, **stats, **losses, params=sum(p.numel() for p in model.parameters()))


def stage_steps(budget, stage: str) -> int:
    """The training steps ``budget`` gives AR ``stage`` (the drafters share ``drafter_steps``)."""
    return {"target": budget.ar_steps, "draft_model": budget.draft_model_steps}.get(stage, budget.drafter_steps)


def init_positions(model: GPT, kind: str, std: float = 0.02) -> None:
    """The position embedding's start: ``normal`` (every slot its own random vector, AR-DTok's) or
    ``grid``: the image slots start as a row part plus a column part, each sinusoids of its index
    over half the width (the condition slots stay random), at the same scale. A grid start tells
    the model from step 0 which slots are one row apart, at every position alike; training then
    moves every slot freely, and the format (one vector a slot) is unchanged."""
    torch.nn.init.normal_(model.abs_pe, std=std)
    if kind == "normal":
        return
    if kind != "grid":
        raise ValueError(f"position embedding start 'normal' or 'grid', not {kind!r}")
    height, width = model.config.grid_hw
    half = model.config.dim // 2

    def sinusoids(count: int, size: int) -> torch.Tensor:
        freqs = torch.exp(-math.log(count) * torch.arange(size // 2) / max(size // 2, 1))
        angles = torch.arange(count)[:, None] * freqs[None] * math.pi
        return torch.cat([angles.sin(), angles.cos()], dim=1)  # [count, size], entries of norm ~1

    rows = sinusoids(height, half)[:, None].expand(height, width, half)
    cols = sinusoids(width, model.config.dim - half)[None].expand(height, width, -1)
    grid = torch.cat([rows, cols], dim=-1).reshape(height * width, -1) * std * math.sqrt(2)
    n_cond = model.config.cond_len
    with torch.no_grad():  # slot n_cond + j holds image token j (the last token is never fed)
        model.abs_pe[0, n_cond:] = grid[: model.config.n_positions - n_cond]


def init_from_pixels(model: GPT, squares: torch.Tensor, std: float = 0.02, share: float = 0.5) -> None:
    """Start each code's input embedding and output row from the pixels it draws (a codebook of
    squares, ``[codes, 3 p^2]``): a fixed random projection of its standardised pixels, ``share``
    of the variance, the rest random as usual. Codes that look alike then start alike, so what the
    model learns of one colour or edge holds for its look-alikes from step 0 (a 4 px square's
    2,048 codes are otherwise 2,048 unrelated vectors to learn one by one)."""
    if squares.shape[0] != model.config.vocab_size:
        raise ValueError(f"a codebook of {squares.shape[0]} squares for a model of {model.config.vocab_size} codes")
    generator = torch.Generator().manual_seed(0)
    pixels = (squares - squares.mean(0)) / squares.std(0).clamp_min(1e-6)
    projection = torch.randn(pixels.shape[1], model.config.dim, generator=generator) / math.sqrt(pixels.shape[1])
    features = pixels @ projection
    features = features / features.std() * std * math.sqrt(share)
    with torch.no_grad():
        for weight in (model.tok_embeddings.weight, model.output.weight):
            weight.mul_(math.sqrt(1 - share)).add_(features.to(weight))


def ar_loss(pipe, stage: str, model: GPT, data: SimpleNamespace, steps: int):
    """The stage's ``loss_fn(step)``: cross-entropy of a batch, some steps under ZipAR's view
    and, from ``input_noise_from`` of the steps on, with noisy teacher forcing."""
    side, vocab, budget, device = pipe.recipe.grid(stage), pipe.codes, pipe.budget, pipe.device
    # The target and the drafters (MuLo-SD v2 drafts ZipAR-style); not the draft model, which
    # SD and LANTERN-chain run token by token.
    zipar_share = budget.zipar_share if stage != "draft_model" else 0.0
    proxy_weight = budget.proxy_weight if stage == "target" else 1.0
    windows = budget.zipar_windows if zipar_share else ()
    scenes = pipe.recipe.scenes
    reach = scenes.object_px * side // scenes.canvas if scenes else 0  # an object's side in cells
    if budget.open_weight != 1.0 and reach < 2:
        raise ValueError("open_weight weighs the open cells of scenes whose objects span 2 cells or more")
    masks = {w: training_mask(COND_LEN + 1, side, side, w).to(device) for w in windows}
    token_weights = {}  # per window: the loss weight of each target token in a masked step
    if proxy_weight != 1.0:
        for w in windows:
            token_weights[w] = torch.ones(side * side, device=device)
            token_weights[w][proxied_targets(side, side, w).to(device)] = proxy_weight

    def loss_fn(step):
        # One generator per step, so a stage resumed in a later session draws what an
        # uninterrupted run would have.
        rng = np.random.default_rng([pipe.seed, sum(map(ord, stage)), step])
        x, cond = ar_batch(pipe, data, rng, budget.ar_batch, step)
        inputs = x[:, :-1]
        if budget.input_noise > 0 and step >= budget.input_noise_from * steps:
            # noisy teacher forcing: predict the clean token anyway
            inputs = noisy_inputs(inputs, budget.input_noise, budget.input_noise_kind, vocab, rng)
        mask, weights, view = None, None, inputs
        if rng.random() < zipar_share:  # ZipAR's view: hidden slots and row-end proxies
            window = int(rng.choice(list(masks)))
            # (a neighbour-input model reads the row above as ZipAR has it: the true row ends, which
            # replace their proxies long before the row below reaches them)
            mask, inputs = masks[window], training_inputs(inputs, side, side, window)
            weights = token_weights.get(window)
        keep_weights = scene_weights(x, budget, side, reach, rng)
        if keep_weights is not None:  # the head on every object token, a share of the background's
            if weights is not None:
                keep_weights = keep_weights * weights
            with autocast(device):
                return weighted_loss(model, inputs, cond, mask, x, keep_weights, view)
        with autocast(device):
            logits = model(inputs, cond, mask, view=view)
        if weights is None:
            return F.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1))
        losses = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")
        return (losses * weights).mean()  # the other tokens' gradients as in an unweighted step

    return loss_fn


NOISE_KINDS = ("codes", "scene")


def noisy_inputs(inputs: torch.Tensor, share: float, kind: str, vocab: int, rng: np.random.Generator) -> torch.Tensor:
    """``inputs [B, L]`` with each token replaced with probability ``share``: by any code of
    ``vocab`` (``kind`` "codes") or by a token drawn from elsewhere in its own sequence ("scene":
    mostly the background, sometimes another object's piece, the misses a model makes)."""
    if kind not in NOISE_KINDS:
        raise ValueError(f"input noise kind must be one of {', '.join(NOISE_KINDS)} (got {kind!r})")
    replaced = torch.from_numpy(rng.random(inputs.shape) < share).to(inputs.device)
    if kind == "scene":
        elsewhere = torch.from_numpy(rng.integers(0, inputs.shape[1], size=inputs.shape)).to(inputs.device)
        replacements = torch.gather(inputs, 1, elsewhere)
    else:
        replacements = torch.from_numpy(rng.integers(0, vocab, size=inputs.shape)).to(inputs.device)
    return torch.where(replaced, replacements, inputs)


def weighted_loss(
    model: GPT, inputs, cond, mask, targets: torch.Tensor, weights: torch.Tensor, view=None
) -> torch.Tensor:
    """Sum of ``weights [B, L]`` times the cross-entropy of ``targets``, over ``targets.numel()``:
    the output head runs only on the positions of non-zero weight (``view``: ``GPT.forward``'s)."""
    hidden = model(inputs, cond, mask, hidden=True, view=view)
    return weighted_cross_entropy(model.output, hidden.reshape(-1, hidden.shape[-1]), targets, weights)


def weighted_cross_entropy(head, features: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``head`` (features ``[N, D]`` -> logits) run only on the rows of ``features [numel, D]``
    whose weight is non-zero, their cross-entropy against ``targets`` weighted by ``weights``
    (both of any shape holding ``numel`` entries, in ``features``' row order), summed over
    ``targets.numel()``: with ``background_sample``'s weights, an unbiased estimate of the mean."""
    keep = weights.reshape(-1) > 0
    logits = head(features[keep]).float()
    losses = F.cross_entropy(logits, targets.reshape(-1)[keep], reduction="none")
    return (losses * weights.reshape(-1)[keep]).sum() / targets.numel()


def background_token(tokens: torch.Tensor) -> torch.Tensor:
    """``tokens [B, L]`` -> each scene's background ``[B]``: its most common token (the flat field
    around the objects, ~85 % of a scene)."""
    return torch.mode(tokens, dim=1).values


def background_mask(tokens: torch.Tensor) -> torch.Tensor:
    """``tokens [B, L]`` -> where each is its scene's background (``background_token``)."""
    return tokens == background_token(tokens)[:, None]


def before_first_object(tokens: torch.Tensor) -> torch.Tensor:
    """``tokens [B, L]`` -> the positions up to and including each scene's first object token
    (``background_mask``), in raster order: where the prefix is all background."""
    objects = (~background_mask(tokens)).long()
    return objects.cumsum(1) - objects == 0


def scene_weights(tokens: torch.Tensor, budget, side: int, reach: int, rng: np.random.Generator):
    """The loss weights ``[B, L]`` of a batch of scenes ``tokens`` under ``budget``: a sampled share
    of the background (``background_sample``), the cells before the first object
    (``first_start_weight``) and the open cells (``open_weight``) weighted up; None when the budget
    weighs every token alike."""
    share = budget.background_loss_share
    if share == 1.0 and budget.open_weight == 1.0 and budget.first_start_weight == 1.0:
        return None
    weights = background_sample(tokens, share, rng) if share < 1.0 else torch.ones(tokens.shape, device=tokens.device)
    if budget.first_start_weight != 1.0:  # nothing begun yet: an object must begin by its last row
        weights = torch.where(before_first_object(tokens), weights * budget.first_start_weight, weights)
    if budget.open_weight != 1.0:  # the decisions of a scene (the background's still sampled)
        weights = torch.where(open_cells(tokens, side, reach), weights * budget.open_weight, weights)
    return weights


def open_cells(tokens: torch.Tensor, side: int, reach: int) -> torch.Tensor:
    """``tokens [B, L]`` (scenes on a ``side``-wide grid) -> where no object token (``background_mask``)
    lies within ``reach`` cells before a cell in raster order: in the ``reach - 1`` rows above it,
    ``reach - 1`` columns either side, or in its own row up to ``reach - 1`` to its left. There the
    next token begins an object or stays background: it depends on the prefix alone, not the token."""
    objects = (~background_mask(tokens)).float().reshape(-1, 1, side, side)
    near = reach - 1
    above = F.pad(objects, (near, near, near, 0))[:, :, :-1]  # cell (r, c) sees rows r - near .. r - 1
    left = F.pad(objects, (near, 0, 0, 0))[:, :, :, :-1]  # and columns c - near .. c - 1 of its row
    covered = F.max_pool2d(above, (near, 2 * near + 1), stride=1) + F.max_pool2d(left, (1, near), stride=1)
    return (covered == 0).reshape(tokens.shape)


def background_sample(tokens: torch.Tensor, share: float, rng: np.random.Generator) -> torch.Tensor:
    """Loss weights ``[B, L]`` of a batch of scenes: 1 for every token but the background's
    (``background_mask``), and for those 1 / ``share`` on a random ``share`` of them, 0 on the
    rest. The weighted mean estimates the full one without bias, and the rare object tokens keep
    their whole signal."""
    background = background_mask(tokens)
    drawn = torch.from_numpy(rng.random(tokens.shape) < share).to(tokens.device)
    weights = torch.ones(tokens.shape, device=tokens.device)
    return weights.masked_fill(background, 1.0 / share).masked_fill(background & ~drawn, 0.0)


def measured_losses(pipe, stage: str, model: GPT, tokens, cond, groups: dict) -> dict[str, float]:
    """Every loss in eval mode on the kept weights, training images too (the generalisation gap),
    and, but for the draft model, what ZipAR's view costs, teacher-forced."""
    losses = {
        f"{name}_loss": validation_loss(model, tokens[idx], cond[idx], pipe.device)
        for name, idx in groups.items()
        if len(idx)
    }
    val = groups["val"]
    if stage != "draft_model":
        for window in MEASURED_WINDOWS:
            loss = validation_loss(model, tokens[val], cond[val], pipe.device, zipar_window=window)
            losses[f"val_loss_zipar_w{window}"] = loss
    if pipe.recipe.scenes:  # the objects apart: a few percent of a scene's tokens, its hard part
        for name in ("val", "train"):
            parts = object_losses(model, tokens[groups[name]], cond[groups[name]], pipe.device)
            losses.update({f"{name}_{key}": value for key, value in parts.items()})
    return losses


def ar_data(pipe, side: int) -> SimpleNamespace:
    """The training material of an AR model on a ``side`` x ``side`` grid: token sequences
    (originals, then augmented copies), the precomputed text conditions of the originals,
    each row's original (``source``), the split and the sampling weights of training rows."""
    z = np.load(pipe.run / "tokens.npz")
    if "cond_short" not in z.files:
        raise RuntimeError(f"{pipe.run / 'tokens.npz'} predates short prompts: delete it to rebuild the tokens stage")
    is_val = z["is_val"]
    source = z["source"] if "source" in z.files else np.arange(len(is_val))
    train_rows = np.flatnonzero(~is_val[source])
    # Every emoji equally likely, its skin-tone variants, styles and copies sharing its weight:
    # variants are 58 % of the images but near-duplicates, and the base emoji are what prompts
    # ask for. (The keys travel in tokens.npz, so the AR stages run without the renders, on a
    # GPU machine.)
    keys = z["keys"] if "keys" in z.files else np.array(pipe.data.keys)
    group = np.unique(keys[source[train_rows]], return_inverse=True, return_counts=True)
    weights = 1.0 / group[2][group[1]]
    names = ("cond_name", "cond_text", "cond_short", "cond_name_style")
    conds = {k: torch.from_numpy(z[k].astype(np.float32)) for k in names if k in z.files}
    fresh = None
    if pipe.recipe.scenes:  # training batches: fresh scenes, conditioned as they come
        from mulo.train.stages.scene_tokens import SceneTokens

        fresh = SimpleNamespace(scenes=SceneTokens(pipe), clip=pipe.load_clip(), px=side * pipe.recipe.patch)
        if pipe.recipe.scene_condition != "clip":  # the stored rows (held out) by their prompts
            conds = {"cond_name": scene_conditions(pipe, fresh.clip, stored_scene_prompts(pipe, keys)).cpu()}
    return SimpleNamespace(
        fresh=fresh,
        tokens=torch.from_numpy(z[f"tokens{side * 4}"].astype(np.int64)).reshape(len(source), -1),
        **conds,
        short_ids=z["short_ids"],
        short_ptr=z["short_ptr"],
        is_val=is_val,
        split=z["split"] if "split" in z.files else None,
        source=source,
        train_idx=train_rows,
        weights=weights / weights.sum(),
    )


def ar_batch(pipe, data: SimpleNamespace, rng: np.random.Generator, batch: int, step: int = 0):
    """A training batch: token sequences ``[B, L]`` and their conditions ``[B, T, C]``, each
    text drawn from the recipe's mix (name / name with its style word / short prompt /
    description) and dropped to the null condition at the CFG rate. Scenes: step ``step``'s
    fresh scenes (``scene_tokens``)."""
    if getattr(data, "fresh", None) is not None:
        return fresh_batch(pipe, data.fresh, rng, batch, step)

    def text_condition(i: int, kind: str) -> torch.Tensor:
        n_short = data.short_ptr[i + 1] - data.short_ptr[i]
        if kind == "description":
            return data.cond_text[i]
        if kind == "name_style" and hasattr(data, "cond_name_style"):
            return data.cond_name_style[i]
        if kind == "short" and n_short:  # one of the image's short prompts, uniformly
            return data.cond_short[data.short_ids[data.short_ptr[i] + rng.integers(n_short)]]
        return data.cond_name[i]  # the name (also for images without a short prompt, "rocket")

    rows = rng.choice(data.train_idx, size=min(batch, len(data.train_idx)), replace=False, p=data.weights)
    mix = pipe.budget.ar_text_mix
    kinds = rng.choice(list(mix), size=len(rows), p=list(mix.values()))
    cond = torch.stack([text_condition(data.source[r], kind) for r, kind in zip(rows, kinds, strict=True)])
    drop = torch.from_numpy(rng.random(len(rows)) < CFG_DROPOUT)[:, None, None]
    cond = cond.masked_fill(drop, 0.0)  # the null condition is all-zero features
    return data.tokens[rows].to(pipe.device), cond.to(pipe.device)


@torch.no_grad()
def fresh_batch(pipe, fresh: SimpleNamespace, rng: np.random.Generator, batch: int, step: int):
    """Training scenes [step * batch, (step + 1) * batch): their tokens at the model's size, each
    conditioned on its prompt, its prompt without background ("short") or its description, by the
    budget's mix, dropped to the null condition at the CFG rate."""
    rows = fresh.scenes.rows(step * batch, batch)
    mix = pipe.budget.ar_text_mix
    kinds = rng.choice(list(mix), size=batch, p=list(mix.values()))
    column = {"name": "name", "name_style": "name", "short": "short", "description": "description"}
    texts = [str(rows[column[kind]][i]) for i, kind in enumerate(kinds)]
    cond = scene_conditions(pipe, fresh.clip, texts)
    drop = torch.from_numpy(rng.random(batch) < CFG_DROPOUT)[:, None, None].to(cond.device)
    cond = cond.masked_fill(drop, 0.0)
    tokens = torch.from_numpy(rows[f"tokens{fresh.px}"].astype(np.int64)).reshape(batch, -1)
    return tokens.to(pipe.device), cond.float()


def scene_conditions(pipe, clip, texts) -> torch.Tensor:
    """``[len(texts), T, C]``: scenes prompts or descriptions as the recipe's models read them (the
    mini-CLIP's word features, or the prompt's symbols: ``mulo.families.emoji.scene_symbols``)."""
    features = None
    if pipe.recipe.scene_condition in ("clip", "clip_placed"):
        features = clip.condition_features(clip.tokenizer.batch(texts).to(pipe.device))
    if pipe.recipe.scene_condition == "clip":
        return features
    from mulo.families.emoji import column_symbols, scene_symbols
    from mulo.train.stages.export import scene_language

    language = scene_language(pipe.recipe.scenes, pipe.recipe.scene_condition)
    if features is not None:  # clip_placed: the features, then the placed symbols' channels
        return torch.cat([features, column_symbols(texts, language, clip.cond_len).to(features)], dim=-1)
    return scene_symbols(texts, language, clip.cond_len, clip.cond_dim).to(pipe.device)


def stored_scene_prompts(pipe, keys) -> list[str]:
    """The prompts of the scenes tokens.npz holds (``SceneStream.data``'s: the training scenes, then
    the held-out ones), objects in their prompt's order: the order placed symbols put in columns (a
    key sorts its names, so a prompt rebuilt from it put held-out objects in the wrong columns)."""
    from mulo.train.scenes import describe

    shown = stored_scenes(pipe)
    if [s.key for s in shown] != list(keys):
        raise RuntimeError(f"{pipe.run / 'tokens.npz'} holds other scenes than the recipe's: delete it to re-encode")
    return [describe(s)[0] for s in shown]


def held_out(pipe, data: SimpleNamespace) -> dict[str, np.ndarray]:
    """Original images to measure losses on: the held-out images (styled data: the held-out
    (emoji, style) pairs and the unseen emoji apart) and as many training images (scenes: as many of
    each object count as the held-out ones)."""
    rng = np.random.default_rng(pipe.seed)
    if data.split is None:
        groups = {"val": np.flatnonzero(data.is_val)}
    else:
        groups = {"val": np.flatnonzero(data.split == styles.HELD_PAIR)}
        groups["val_unseen_emoji"] = np.flatnonzero(data.split == styles.HELD_EMOJI)
    train_originals = np.flatnonzero(~data.is_val)
    if pipe.recipe.scenes:  # as many training scenes of each object count as held-out ones
        groups["train"] = matched_by_objects(rng, stored_object_counts(pipe), groups["val"], train_originals)
        return groups
    groups["train"] = np.sort(
        rng.choice(train_originals, size=min(len(groups["val"]), len(train_originals)), replace=False)
    )
    return groups


def stored_scenes(pipe) -> list:
    """The scenes tokens.npz holds, in its rows' order (``SceneStream.data``'s: the training scenes,
    then the held-out ones)."""
    from mulo.train.scenes import HELD_OUT, TRAIN

    stream, budget = pipe.scene_stream, pipe.budget
    return stream.scenes(0, budget.images, TRAIN) + stream.scenes(0, budget.held_out_scenes, HELD_OUT)


def stored_object_counts(pipe) -> np.ndarray:
    """How many objects each scene tokens.npz holds shows, in its rows' order."""
    return np.array([len(s.objects) for s in stored_scenes(pipe)])


def load_stage(pipe, stage: str) -> GPT:
    """AR ``stage``'s kept weights (``RUN/STAGE.pt``, float32 or a resume point's float16) in its
    saved config (``RUN/STAGE.json``), in eval mode on the pipeline's device."""
    model = GPT(GPTConfig.from_json(json.loads((pipe.run / f"{stage}.json").read_text())))
    model.load_state_dict(torch.load(pipe.run / f"{stage}.pt", map_location="cpu", weights_only=True))
    return model.to(pipe.device).eval()


def matched_by_objects(rng: np.random.Generator, counts: np.ndarray, val: np.ndarray, train: np.ndarray) -> np.ndarray:
    """A sample of the ``train`` rows with as many scenes of each object count as ``val`` holds.

    A held-out scene pairs two emoji (2 or 3 objects) where a training scene holds 1 to 3, and a
    scene's loss per token grows with its objects (the target's, per token: 0.0104 / 0.0161 / 0.0212
    at 1 / 2 / 3): a sample of every training scene would put a loss of fewer objects under the
    held-out one and call the difference a generalisation gap (1.14x, where scenes of the same
    counts give 1.00x)."""
    picked = []
    for count, wanted in zip(*np.unique(counts[val], return_counts=True), strict=True):
        pool = train[counts[train] == count]
        picked.append(rng.choice(pool, size=min(wanted, len(pool)), replace=False))  # all, where fewer
    return np.sort(np.concatenate(picked)) if picked else train[:0]


@torch.no_grad()
def validation_loss(
    model: GPT, tokens: torch.Tensor, cond: torch.Tensor, device: str, zipar_window: int | None = None, batch: int = 32
) -> float:
    """Mean teacher-forced cross-entropy of ``tokens [N, L]`` given ``cond``, in batches: causal,
    or as ZipAR with ``zipar_window`` sees them (its mask and row-end proxies)."""
    height, width = model.config.grid_hw
    mask = None
    if zipar_window is not None:
        mask = training_mask(model.config.cond_len, height, width, zipar_window).to(device)
    total = 0.0
    for i in range(0, len(tokens), batch):
        x = tokens[i : i + batch].to(device)
        inputs = x[:, :-1] if zipar_window is None else training_inputs(x[:, :-1], height, width, zipar_window)
        logits = model(inputs, cond[i : i + batch].to(device), mask, view=x[:, :-1])
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum"))
    return round(total / tokens.numel(), 4)


@torch.no_grad()
def object_losses(model: GPT, tokens: torch.Tensor, cond: torch.Tensor, device: str, batch: int = 32) -> dict:
    """Teacher-forced cross-entropy and top-1 accuracy of a scene's object tokens (every token
    but its most common one, the background's) and the background's loss: the part a scenes
    model learns last, which the mean over all tokens (~85 % background) hides."""
    sums = {"object": 0.0, "object_hits": 0.0, "background": 0.0}
    counts = {"object": 0, "background": 0}
    for i in range(0, len(tokens), batch):
        x = tokens[i : i + batch].to(device)
        logits = model(x[:, :-1], cond[i : i + batch].to(device)).float()
        losses = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")
        background = background_mask(x)
        objects = ~background
        sums["object"] += float(losses[objects].sum())
        sums["object_hits"] += float((logits.argmax(-1) == x)[objects].sum())
        sums["background"] += float(losses[background].sum())
        counts["object"] += int(objects.sum())
        counts["background"] += int(background.sum())
    n_obj, n_bg = max(counts["object"], 1), max(counts["background"], 1)
    return {
        "object_loss": round(sums["object"] / n_obj, 4),
        "object_accuracy": round(sums["object_hits"] / n_obj, 4),
        "background_loss": round(sums["background"] / n_bg, 4),
    }
