"""Training the twemoji families: ``python -m mulo train twemoji|twemoji-64 [--smoke] [--device cuda]``.

Two geometries, one recipe each (``RECIPES``): ``twemoji`` is Tar's 512 px setting scaled down,
a 32x32-token target on 128 px renders of the Twemoji SVGs with 16x16 (r = 2) and 8x8 (r = 4)
drafters; ``twemoji-64`` is the first family, 16x16 tokens on the 64 px PNGs. Stages, each
resumable and skipped once its output exists in the run folder:
  data       npm package(s) -> images (at the three sizes) + texts (train / val split)
  clip       mini-CLIP (text transformer + image CNN on 64 px), contrastive
  vq         diffusers VQModel, 4x downsampling, one codebook for the three sizes; with several
             candidate codebook sizes, each is trained and the oracle MuLo-SD picks one
  tokens     every image encoded at the three sizes; text conditions precomputed
  target, drafter_r2, drafter_r4, draft_model   AR models on the target grid, /2, /4, target grid (small)
  upsampler_r2, upsampler_r4                      learned token up-samplers
  eagle      EAGLE-2's feature-level draft head, on the frozen target's features
  export     fp16 safetensors + JSON configs into the assets folder
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel

from mulo.engine import Engine
from mulo.methods.zipar import proxied_targets, training_inputs, training_mask
from mulo.models.gpt import GPT
from mulo.models.text import IMAGE_PX, MiniCLIP, WordTokenizer
from mulo.models.upsample import TokenUpsampler
from mulo.train import data as data_mod
from mulo.train import styles, vq_stage
from mulo.train.assets import adopt_assets, export
from mulo.train.eagle import train_eagle_head
from mulo.train.loop import autocast, hardware, init_weights, train
from mulo.train.recipes import (
    CFG_DROPOUT,
    COND_LEN,
    NAME_TEXT_PROB,
    PSNR_SLACK,
    RECIPES,
    STAGES,
    STUDY_BOUND,
    STUDY_SETTING,
    Budget,
    Recipe,
    build_vq,
    vq_config,
)

log = logging.getLogger(__name__)


def to_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    return images if images.shape[-1] == size else F.interpolate(images, size=(size, size), mode="area")


class Pipeline:
    VALIDATION_IMAGES = 512  # held-out images the AR stages' model selection scores (a fixed subset)

    def __init__(self, run_dir, assets, recipe: Recipe, budget: Budget, device: str = "cpu", seed: int = 0, cache=None):
        self.run, self.assets, self.recipe, self.budget = Path(run_dir), Path(assets), recipe, budget
        self.device = device
        default_cache = "styles" if recipe.styles else "twemoji"
        self.cache = Path(cache) if cache else Path.home() / ".cache" / "mulo" / default_cache
        self.run.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.report_path = self.run / "report.json"
        self.report = json.loads(self.report_path.read_text()) if self.report_path.exists() else {}
        self._data = None

    # -- bookkeeping ---------------------------------------------------------------------------
    def record(self, stage: str, **values) -> None:
        self.report[stage] = {**self.report.get(stage, {}), **values, "hardware": hardware(self.device)}
        self.report_path.write_text(json.dumps(self.report, indent=1))

    def rng(self, stage: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, sum(map(ord, stage))])

    @property
    def codes(self) -> int:
        """The codebook size of the run's VQ (the study's pick when there were candidates)."""
        return int(self.report["vq"]["codes"]) if "codes" in self.report.get("vq", {}) else self.recipe.vq_codes[0]

    @property
    def data(self) -> data_mod.EmojiData:
        if self._data is None:
            if self.recipe.styles:  # limited to a smoke budget's images before anything is rendered
                self._data = styles.load(self.cache, self.recipe.sizes, self.recipe.styles, self.budget.images)
                return self._data
            full = data_mod.load_scales(self.cache, self.recipe.sizes) if self.recipe.svg else data_mod.load(self.cache)
            if self.budget.images:
                keep = np.zeros(len(full.names), dtype=bool)
                keep[: self.budget.images] = True
                keep[np.flatnonzero(full.is_val)[:8]] = True
                full = full.subset(keep)
            self._data = full
        return self._data

    def text_of(self, i: int, kind: str) -> str:
        """Image ``i``'s text of one kind: its name, its name with its style word, its description."""
        d = self.data
        if kind == "name_style" and d.styles:
            return f"{d.names[i]} {d.styles[i]}"
        return d.texts[i] if kind == "description" else d.names[i]

    def images_at(self, px: int, index=slice(None)) -> torch.Tensor:
        """``[N, 3, px, px]`` floats in [0, 1]: the renders at that size, else area-resized."""
        d = self.data
        return to_float(d.scales[px][index]) if px in d.scales else resize(to_float(d.images[index]), px)

    # -- stages --------------------------------------------------------------------------------
    def stage_data(self) -> None:
        d = self.data
        counts = {}
        if d.styles:
            split = d.split
            counts = dict(
                per_style={w: d.styles.count(w) for w in self.recipe.styles},
                held_out_pairs=int((split == styles.HELD_PAIR).sum()),
                held_out_emoji_images=int((split == styles.HELD_EMOJI).sum()),
                augment_copies=self.budget.augment_copies,
            )
        self.record("data", images=len(d.names), val=int(d.is_val.sum()), **counts)

    def stage_clip(self) -> None:
        d = self.data
        torch.manual_seed(self.seed)
        clip = MiniCLIP(WordTokenizer.build(d.texts, COND_LEN).vocab, max_len=COND_LEN).to(self.device)
        train_idx = np.flatnonzero(~d.is_val)
        images = self.images_at(IMAGE_PX)  # the 64 px renders, not a resize of 128
        keys = np.array(d.keys)
        rng = self.rng("clip")

        def loss_fn(step):
            idx = rng.choice(train_idx, size=min(self.budget.clip_batch, len(train_idx)), replace=False)
            texts = self.sample_texts(idx, rng)
            shift = rng.integers(-3, 4, size=2)  # light translation augmentation
            batch = torch.roll(images[idx], shifts=tuple(int(s) for s in shift), dims=(2, 3))
            same = torch.from_numpy(keys[idx][:, None] == keys[idx][None, :])
            return clip.loss(batch.to(self.device), clip.tokenizer.batch(texts).to(self.device), same.to(self.device))

        stats = train(
            "clip",
            clip,
            loss_fn,
            self.budget.clip_steps,
            self.run / "clip.ckpt",
            lr=1e-3,
            every=self.budget.checkpoint_every,
        )
        val = np.flatnonzero(d.is_val)
        from mulo.eval.metrics import adherence

        score = adherence(clip, images[val], [d.keys[i] for i in val], d.names, d.keys)
        torch.save(clip.state_dict(), self.run / "clip.pt")
        (self.run / "clip_vocab.json").write_text(json.dumps(clip.tokenizer.vocab))
        self.record("clip", **stats, val_top5_retrieval=round(score, 4), vocab=len(clip.tokenizer.vocab))

    def sample_texts(self, idx, rng) -> list[str]:
        """Mini-CLIP's texts: the name (half the time with the style word, on styled data), else the
        full description (which names the style)."""
        d, out = self.data, []
        for i in idx:  # one-style data draws exactly what it drew before styles existed
            if rng.random() >= NAME_TEXT_PROB:
                out.append(d.texts[i])
            else:
                out.append(self.text_of(i, "name_style" if d.styles and rng.random() < 0.5 else "name"))
        return out

    def load_clip(self) -> MiniCLIP:
        vocab = json.loads((self.run / "clip_vocab.json").read_text())
        clip = MiniCLIP(vocab, max_len=COND_LEN)
        clip.load_state_dict(torch.load(self.run / "clip.pt", map_location="cpu", weights_only=True))
        return clip.to(self.device).eval()

    def load_vq(self) -> VQModel:
        vq = build_vq(self.codes)
        vq.load_state_dict(torch.load(self.run / "vq.pt", map_location="cpu", weights_only=True))
        return vq.to(self.device).eval()

    @torch.no_grad()
    def stage_tokens(self) -> None:
        from mulo.models.vq import VQTokenizer

        d = self.data
        tok = VQTokenizer(self.load_vq())
        clip = self.load_clip()
        grids = {}
        for size in self.recipe.sizes:
            images = self.images_at(size)
            grids[f"tokens{size}"] = self.encode(tok, images)
        # Augmented copies of the training images (styled data): rows after the originals, each
        # with the original it copies in ``source`` (its texts and split are the original's).
        source = np.arange(len(d.names))
        if self.budget.augment_copies and d.styles:
            copies = self.augmented_tokens(tok)
            source = np.concatenate([source, copies.pop("source")])
            grids = {k: np.concatenate([grids[k], copies[k]]) for k in grids}
        # Short prompts are shared between images ("face" for 170 of them): features once per
        # phrase, and per image a slice short_ids[short_ptr[i] : short_ptr[i + 1]] into them.
        phrases = list(dict.fromkeys(p for ps in d.short_prompts for p in ps))
        index = {p: j for j, p in enumerate(phrases)}
        short_ids = np.array([index[p] for ps in d.short_prompts for p in ps], dtype=np.int32)
        short_ptr = np.cumsum([0, *map(len, d.short_prompts)])
        texts = {"cond_name": d.names, "cond_text": d.texts, "cond_short": phrases}
        if d.styles:
            texts["cond_name_style"] = [self.text_of(i, "name_style") for i in range(len(d.names))]
        conds = {}
        for name, batch_texts in texts.items():
            ids = clip.tokenizer.batch(batch_texts)
            conds[name] = torch.cat(
                [clip.condition_features(ids[i : i + 512].to(self.device)).cpu() for i in range(0, len(ids), 512)]
            )
            conds[name] = conds[name].numpy().astype(np.float16)
        np.savez(
            self.run / "tokens.npz",
            **grids,
            **conds,
            short_ids=short_ids,
            short_ptr=short_ptr,
            is_val=d.is_val,
            keys=np.array(d.keys, dtype=str),
            source=source,
            **({"split": d.split} if d.split is not None else {}),
        )

    def encode(self, tok, images: torch.Tensor) -> np.ndarray:
        parts = [tok.encode(images[i : i + 256].to(self.device)).cpu() for i in range(0, len(images), 256)]
        return torch.cat(parts).numpy().astype(np.int16)

    def augmented_tokens(self, tok) -> dict[str, np.ndarray]:
        """``budget.augment_copies`` copies of every training image, each shrunk and moved alike at
        the three sizes (``styles.random_placement``), rendered from its SVG and encoded."""
        d = self.data
        items = styles.items(self.cache, self.recipe.styles, self.budget.images)
        if [item.key for item in items] != list(d.keys):
            raise RuntimeError("the styled emoji no longer match the cached data set: delete the cache's emoji-*.npz")
        sizes = self.recipe.sizes
        train_idx = np.flatnonzero(~d.is_val)
        rng = self.rng("augment")
        copies = self.budget.augment_copies
        jobs = [(i, styles.random_placement(rng, min(sizes))) for i in train_idx for _ in range(copies)]
        parts = {px: [] for px in sizes}
        for start in range(0, len(jobs), 2048):  # render and encode in chunks: 60,000 copies do not fit at once
            rendered = styles.render_many([(items[i], place) for i, place in jobs[start : start + 2048]], sizes)
            for px in sizes:
                parts[px].append(self.encode(tok, to_float(rendered[px])))
        out = {f"tokens{px}": np.concatenate(parts[px]) for px in sizes}
        out["source"] = np.array([i for i, _ in jobs], dtype=np.int64)
        log.info("tokens: %d augmented copies of %d training images", len(jobs), len(train_idx))
        return out

    def ar_data(self, side: int) -> SimpleNamespace:
        """The training material of an AR model on a ``side`` x ``side`` grid: token sequences
        (originals, then augmented copies), the precomputed text conditions of the originals,
        each row's original (``source``), the split and the sampling weights of training rows."""
        z = np.load(self.run / "tokens.npz")
        if "cond_short" not in z.files:
            raise RuntimeError(
                f"{self.run / 'tokens.npz'} predates short prompts: delete it to rebuild the tokens stage"
            )
        is_val = z["is_val"]
        source = z["source"] if "source" in z.files else np.arange(len(is_val))
        train_rows = np.flatnonzero(~is_val[source])
        # Every emoji equally likely, its skin-tone variants, styles and copies sharing its weight:
        # variants are 58 % of the images but near-duplicates, and the base emoji are what prompts
        # ask for. (The keys travel in tokens.npz, so the AR stages run without the renders, on a
        # GPU machine.)
        keys = z["keys"] if "keys" in z.files else np.array(self.data.keys)
        group = np.unique(keys[source[train_rows]], return_inverse=True, return_counts=True)
        weights = 1.0 / group[2][group[1]]
        names = ("cond_name", "cond_text", "cond_short", "cond_name_style")
        conds = {k: torch.from_numpy(z[k].astype(np.float32)) for k in names if k in z.files}
        return SimpleNamespace(
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

    def ar_batch(self, data: SimpleNamespace, rng: np.random.Generator, batch: int):
        """A training batch: token sequences ``[B, L]`` and their conditions ``[B, T, C]``, each
        text drawn from the recipe's mix (name / name with its style word / short prompt /
        description) and dropped to the null condition at the CFG rate."""

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
        mix = self.budget.ar_text_mix
        kinds = rng.choice(list(mix), size=len(rows), p=list(mix.values()))
        cond = torch.stack([text_condition(data.source[r], kind) for r, kind in zip(rows, kinds, strict=True)])
        drop = torch.from_numpy(rng.random(len(rows)) < CFG_DROPOUT)[:, None, None]
        cond = cond.masked_fill(drop, 0.0)  # the null condition is all-zero features
        return data.tokens[rows].to(self.device), cond.to(self.device)

    def held_out(self, data: SimpleNamespace) -> dict[str, np.ndarray]:
        """Original images to measure losses on: the held-out images (styled data: the held-out
        (emoji, style) pairs and the unseen emoji apart) and as many training images."""
        rng = np.random.default_rng(self.seed)
        if data.split is None:
            groups = {"val": np.flatnonzero(data.is_val)}
        else:
            groups = {"val": np.flatnonzero(data.split == styles.HELD_PAIR)}
            groups["val_unseen_emoji"] = np.flatnonzero(data.split == styles.HELD_EMOJI)
        train_originals = np.flatnonzero(~data.is_val)
        groups["train"] = np.sort(
            rng.choice(train_originals, size=min(len(groups["val"]), len(train_originals)), replace=False)
        )
        return groups

    def stage_ar(self, stage: str) -> None:
        side = self.recipe.grid(stage)
        data = self.ar_data(side)
        tokens, cond_name = data.tokens, data.cond_name
        vocab = self.codes
        config = self.recipe.gpt_config(stage, vocab, cond_name.shape[-1])
        torch.manual_seed(self.seed + side)
        model = GPT(config)
        model.apply(init_weights)
        torch.nn.init.normal_(model.abs_pe, std=0.02)
        model.to(self.device)
        steps = {"target": self.budget.ar_steps, "draft_model": self.budget.draft_model_steps}.get(
            stage, self.budget.drafter_steps
        )

        # The target and the drafters (MuLo-SD v2 drafts ZipAR-style); not the draft model, which
        # SD and LANTERN-chain run token by token.
        zipar_share = self.budget.zipar_share if stage != "draft_model" else 0.0
        proxy_weight = self.budget.proxy_weight if stage == "target" else 1.0
        windows = self.budget.zipar_windows if zipar_share else ()
        masks = {w: training_mask(COND_LEN + 1, side, side, w).to(self.device) for w in windows}
        token_weights = {}  # per window: the loss weight of each target token in a masked step
        if proxy_weight != 1.0:
            for w in windows:
                token_weights[w] = torch.ones(side * side, device=self.device)
                token_weights[w][proxied_targets(side, side, w).to(self.device)] = proxy_weight

        def loss_fn(step):
            # One generator per step, so a stage resumed in a later session draws what an
            # uninterrupted run would have.
            rng = np.random.default_rng([self.seed, sum(map(ord, stage)), step])
            x, cond = self.ar_batch(data, rng, self.budget.ar_batch)
            inputs = x[:, :-1]
            noisy = self.budget.input_noise > 0 and step >= self.budget.input_noise_from * steps
            if noisy:  # noisy teacher forcing: predict the clean token anyway
                noise = torch.from_numpy(rng.random(inputs.shape) < self.budget.input_noise).to(self.device)
                random_codes = torch.from_numpy(rng.integers(0, vocab, size=inputs.shape)).to(self.device)
                inputs = torch.where(noise, random_codes, inputs)
            mask, weights = None, None
            if rng.random() < zipar_share:  # ZipAR's view: hidden slots and row-end proxies
                window = int(rng.choice(list(masks)))
                mask, inputs = masks[window], training_inputs(inputs, side, side, window)
                weights = token_weights.get(window)
            with autocast(self.device):
                logits = model(inputs, cond, mask)
            if weights is None:
                return F.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1))
            losses = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")
            return (losses * weights).mean()  # the other tokens' gradients as in an unweighted step

        # Held-out losses, conditioned on what names the image best: the name with its style word
        # on styled data (a held-out pair is an unseen (emoji, style) combination), else the name.
        cond = getattr(data, "cond_name_style", cond_name)
        groups = self.held_out(data)
        selection = groups["val"][: self.VALIDATION_IMAGES]

        def validate() -> float:
            return validation_loss(model, tokens[selection], cond[selection], self.device)

        stats = train(
            stage,
            model,
            loss_fn,
            steps,
            self.run / f"{stage}.ckpt",
            lr=1.5e-3 if stage != "draft_model" else 2e-3,
            weight_decay=self.budget.weight_decay,
            every=self.budget.checkpoint_every,
            validate=validate if self.budget.validate_every else None,
            validate_every=self.budget.validate_every,
        )
        # every loss in eval mode on the kept weights, training images too (the generalisation gap)
        losses = {
            f"{name}_loss": validation_loss(model, tokens[idx], cond[idx], self.device)
            for name, idx in groups.items()
            if len(idx)
        }
        val = groups["val"]
        if stage != "draft_model":  # what ZipAR's view costs, teacher-forced
            for window in (4, 8):
                loss = validation_loss(model, tokens[val], cond[val], self.device, zipar_window=window)
                losses[f"val_loss_zipar_w{window}"] = loss
        torch.save(model.state_dict(), self.run / f"{stage}.pt")
        (self.run / f"{stage}.json").write_text(json.dumps(asdict(config)))
        self.record(stage, **stats, **losses, params=sum(p.numel() for p in model.parameters()))

    def stage_upsampler(self, r: int) -> None:
        z = np.load(self.run / "tokens.npz")
        px = self.recipe.px
        high = torch.from_numpy(z[f"tokens{px}"].astype(np.int64))
        low = torch.from_numpy(z[f"tokens{px // r}"].astype(np.int64))
        is_val = z["is_val"]
        source = z["source"] if "source" in z.files else np.arange(len(is_val))
        torch.manual_seed(self.seed + r)
        up = TokenUpsampler(self.codes, r, width=128, depth=3).to(self.device)
        train_idx = np.flatnonzero(~is_val[source])  # augmented copies train too
        rng = self.rng(f"upsampler_r{r}")

        def loss_fn(step):
            idx = rng.choice(train_idx, size=min(self.budget.upsampler_batch, len(train_idx)), replace=False)
            return F.cross_entropy(up(low[idx].to(self.device)), high[idx].to(self.device))

        stats = train(
            f"upsampler_r{r}",
            up,
            loss_fn,
            self.budget.upsampler_steps,
            self.run / f"upsampler_r{r}.ckpt",
            lr=2e-3,
            every=self.budget.checkpoint_every,
        )
        with torch.no_grad():
            val = np.flatnonzero(is_val)
            pred = up(low[val].to(self.device)).argmax(1).cpu()
            acc = float((pred == high[val]).float().mean())
        torch.save(up.state_dict(), self.run / f"upsampler_r{r}.pt")
        self.record(f"upsampler_r{r}", **stats, val_token_accuracy=round(acc, 4))

    # -- driver ----------------------------------------------------------------------------------
    def stages(self) -> dict:
        return {
            "data": (self.stage_data, "report.json"),
            "clip": (self.stage_clip, "clip.pt"),
            "vq": (lambda: vq_stage.stage_vq(self), "vq.pt"),
            "tokens": (self.stage_tokens, "tokens.npz"),
            "target": (lambda: self.stage_ar("target"), "target.pt"),
            "drafter_r2": (lambda: self.stage_ar("drafter_r2"), "drafter_r2.pt"),
            "drafter_r4": (lambda: self.stage_ar("drafter_r4"), "drafter_r4.pt"),
            "draft_model": (lambda: self.stage_ar("draft_model"), "draft_model.pt"),
            "upsampler_r2": (lambda: self.stage_upsampler(2), "upsampler_r2.pt"),
            "upsampler_r4": (lambda: self.stage_upsampler(4), "upsampler_r4.pt"),
            "eagle": (lambda: train_eagle_head(self), "eagle.pt"),
            "export": (lambda: export(self), None),
            "card": (self.card, None),
        }

    def run_all(self, only: list[str] | None = None) -> dict:
        assert tuple(self.stages()) == STAGES
        for name, (fn, output) in self.stages().items():
            if only and name not in only:
                continue
            if output and (self.run / output).exists() and name in self.report:
                log.info("stage %s: done already", name)
                continue
            log.info("stage %s", name)
            self.report.pop(name, None)  # an adopted or earlier entry: the stage records its own
            start = time.perf_counter()
            fn()
            self.record(name, stage_seconds=round(time.perf_counter() - start, 1))
        return self.report

    def defaults(self) -> dict:
        """The recipe's knob values, and the up-sampler that reproduces more of the target's codes
        from a perfect r = 2 draft on the validation split: learned (its token accuracy) or pixel
        (the VQ stage's agreement), when the recipe leaves it open."""
        defaults = dict(self.recipe.defaults)
        if "upsampler" not in defaults:
            learned = self.report["upsampler_r2"]["val_token_accuracy"]
            defaults["upsampler"] = "learned" if learned > self.report["vq"]["val_draft_agreement_r2"] else "pixel"
        return defaults

    def card(self) -> None:
        from mulo.families import twemoji as family_mod
        from mulo.train import card

        engine = Engine(family_mod.build(self.recipe.family, self.assets).to(self.device))
        metrics = card.evaluate(engine, self.data, self.load_clip(), self.assets, self.budget.eval_prompts)
        (self.assets / "metrics.json").write_text(json.dumps(metrics, indent=1))
        self.write_card(metrics)

    def write_card(self, metrics: dict) -> None:
        """MODEL_CARD.md from the report and ``metrics`` (rewritable without re-evaluating)."""
        from mulo.train import card

        sizes = {p.name: round(p.stat().st_size / 2**20, 2) for p in sorted(self.assets.glob("*.safetensors"))}
        sizes["total"] = round(sum(sizes.values()), 2)
        recipe = dict(
            vq=vq_config(self.codes),
            target=self.recipe.target,
            draft_model=self.recipe.draft_model,
            cfg_dropout=CFG_DROPOUT,
            name_text_prob=NAME_TEXT_PROB,
        )
        geometry = dict(
            family=self.recipe.family,
            px=self.recipe.px,
            svg=self.recipe.svg,
            styles=self.recipe.styles,
            history=card.history(self.recipe.family),
            study_rule=(
                f"Rule (`recipes.choose_codebook`): among the codebooks whose {self.recipe.px} px validation PSNR is "
                f"within {PSNR_SLACK} dB of the best candidate's, the one with the highest oracle bound "
                f"`{STUDY_BOUND}` at {', '.join(f'{k} = {v}' for k, v in STUDY_SETTING.items())}."
            ),
        )
        card.write_model_card(self.assets, self.report, metrics, asdict(self.budget), sizes, recipe, geometry)


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
        logits = model(inputs, cond[i : i + batch].to(device), mask)
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum"))
    return round(total / tokens.numel(), 4)


def run(
    family="twemoji", run_dir=None, assets=None, smoke=False, device="cpu", only=None, cache=None, adopt=None
) -> dict:
    unknown = [stage for stage in only or () if stage not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage {', '.join(unknown)}: the stages are {', '.join(STAGES)}")
    recipe = RECIPES[family]
    run_dir = run_dir or Path("runs") / family
    assets = assets or Path("assets") / family
    budget = replace(recipe.smoke if smoke else recipe.budget)
    pipeline = Pipeline(Path(run_dir), Path(assets), recipe, budget, device, cache=cache)
    if adopt is not None:
        adopt_assets(pipeline, Path(adopt))
    return pipeline.run_all(only)
