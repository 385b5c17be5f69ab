"""Training the twemoji family: ``python -m mulo train twemoji [--smoke] [--device cuda]``.

Stages, each resumable and skipped once its output exists in the run folder:
  data       npm package -> images + texts (train / val split)
  clip       mini-CLIP (text transformer + image CNN), contrastive
  vq         diffusers VQModel, 4x downsampling, one codebook for 64 / 32 / 16 px
  tokens     every image encoded at the three resolutions; text conditions precomputed
  target, drafter_r2, drafter_r4, draft_model   AR models on 16x16, 8x8, 4x4, 16x16 (small)
  upsampler_r2, upsampler_r4                      learned token up-samplers
  export     fp16 safetensors + JSON configs into the assets folder
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel

from mulo.engine import Engine
from mulo.models.gpt import GPT, GPTConfig
from mulo.models.text import MiniCLIP, WordTokenizer
from mulo.models.upsample import TokenUpsampler
from mulo.train import data as data_mod
from mulo.train.loop import train

log = logging.getLogger(__name__)

COND_LEN = 16
VQ_CONFIG = dict(
    block_out_channels=(32, 64, 64),
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    layers_per_block=1,
    latent_channels=32,
    # 32 codes, not 512: a coarse codebook is what lets a low-res draft name the high-res code
    # (the codebook study: MODEL_CARD.md, History).
    num_vq_embeddings=32,
    vq_embed_dim=8,
    norm_num_groups=16,
    mid_block_add_attention=False,
    sample_size=64,
)
TARGET = dict(dim=256, n_layer=4, n_head=4, multiple_of=64)
DRAFT_MODEL = dict(dim=96, n_layer=2, n_head=2, multiple_of=32)  # about 1/8 of the target
GRIDS = {"target": 16, "drafter_r2": 8, "drafter_r4": 4, "draft_model": 16}
# Recommended knob values written to defaults.json, chosen on the trained family; the design study
# behind each value is in MODEL_CARD.md, History.
# No guidance: these models memorise their ~1,900 emoji, and CFG pushes them off the images they know.
# No codebook pooling (k 0): the target has memorised which code each image uses, and a pooled
# neighbour it gives ~0 probability derails it. tau 0.1: its probabilities are near 0 or large, so
# a smaller tau accepts the same share.
# The whole low-res image in one round (rows_per_block 8 = every row at r 2 and r 4): the VQ
# encoder sees the image below a row too, so a row strip alone re-encodes to other codes.
# Radius 2, the paper's protocol: tau and l calibrated until MuLo-SD's quality matches the baseline's.
DEFAULTS = {"cfg": 1.0, "top_p": 0.8, "tau": 0.1, "k": 0, "radius": 2, "rows_per_block": 8}
NAME_TEXT_PROB = 0.6  # mini-CLIP text augmentation: the emoji's name, else its full description
CFG_DROPOUT = 0.1


@dataclass
class Budget:
    images: int | None = None  # limit the data set (smoke runs)
    clip_steps: int = 600
    clip_batch: int = 128
    vq_steps: int = 1200
    vq_batch: int = 16
    ar_steps: int = 3600  # the 16x16 target
    drafter_steps: int = 2000  # each low-res drafter
    ar_batch: int = 32
    draft_model_steps: int = 1700
    upsampler_steps: int = 800
    upsampler_batch: int = 64
    checkpoint_every: int = 100
    eval_prompts: int = 120
    # AR text augmentation: the name, a short prompt (one short name alone, "pizza" for "slice of
    # pizza", or one content word of the name, "sun" for "sun with face"), or the full description.
    # Short prompts off in the shipped weights: at this budget the AR models see each of ~4,100 short
    # prompts about six times, too few to learn them, and they cost adherence to names; short names
    # are resolved by aliases.json instead (MODEL_CARD.md, History).
    ar_text_mix: dict = field(default_factory=lambda: {"name": 0.6, "short": 0.0, "description": 0.4})
    # AR noisy teacher forcing: fraction of input tokens replaced by random codes, from this
    # fraction of each stage's steps on. Off: the AR models here memorise ~1,900 emoji, exact context
    # is what lets them, and the noise undid the target's memorisation (MODEL_CARD.md, History).
    input_noise: float = 0.0
    input_noise_from: float = 0.625


FULL = Budget()
SMOKE = Budget(
    images=48,
    clip_steps=3,
    clip_batch=16,
    vq_steps=3,
    vq_batch=4,
    ar_steps=3,
    drafter_steps=3,
    ar_batch=4,
    draft_model_steps=3,
    upsampler_steps=3,
    upsampler_batch=4,
    checkpoint_every=2,
    eval_prompts=2,
    input_noise=0.1,
    input_noise_from=0.0,
    ar_text_mix={"name": 0.5, "short": 0.2, "description": 0.3},  # every kind of text on the smoke run
)


def gpt_config(stage: str, vocab: int, cond_dim: int) -> GPTConfig:
    side = GRIDS[stage]
    sizes = DRAFT_MODEL if stage == "draft_model" else TARGET
    return GPTConfig(vocab_size=vocab, max_seq_len=side * side, cond_len=COND_LEN + 1, cond_dim=cond_dim, **sizes)


def to_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    return images if images.shape[-1] == size else F.interpolate(images, size=(size, size), mode="area")


def build_vq() -> VQModel:
    return VQModel(**VQ_CONFIG)


class Pipeline:
    def __init__(self, run_dir: Path, assets: Path, budget: Budget, device: str = "cpu", seed: int = 0, cache=None):
        self.run, self.assets, self.budget, self.device = Path(run_dir), Path(assets), budget, device
        self.cache = Path(cache) if cache else Path.home() / ".cache" / "mulo" / "twemoji"
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
    def data(self) -> data_mod.EmojiData:
        if self._data is None:
            full = data_mod.load(self.cache)
            if self.budget.images:
                keep = np.zeros(len(full.names), dtype=bool)
                keep[: self.budget.images] = True
                keep[np.flatnonzero(full.is_val)[:8]] = True
                full = full.subset(keep)
            self._data = full
        return self._data

    # -- stages --------------------------------------------------------------------------------
    def stage_clip(self) -> None:
        d = self.data
        torch.manual_seed(self.seed)
        clip = MiniCLIP(WordTokenizer.build(d.texts, COND_LEN).vocab, max_len=COND_LEN).to(self.device)
        train_idx = np.flatnonzero(~d.is_val)
        images = to_float(d.images)
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
        d = self.data
        return [d.names[i] if rng.random() < NAME_TEXT_PROB else d.texts[i] for i in idx]

    def load_clip(self) -> MiniCLIP:
        vocab = json.loads((self.run / "clip_vocab.json").read_text())
        clip = MiniCLIP(vocab, max_len=COND_LEN)
        clip.load_state_dict(torch.load(self.run / "clip.pt", map_location="cpu", weights_only=True))
        return clip.to(self.device).eval()

    def stage_vq(self) -> None:
        d = self.data
        torch.manual_seed(self.seed)
        vq = build_vq().to(self.device)
        train_idx = np.flatnonzero(~d.is_val)
        images = to_float(d.images)
        rng = self.rng("vq")
        b = self.budget.vq_batch

        recent = {}  # the last crop batch's encoder outputs and codes, for dead-code restarts

        def loss_fn(step):
            # Three resolutions per step; 64 px as random 32 px crops (the net is convolutional).
            idx = rng.choice(train_idx, size=3 * b, replace=len(train_idx) < 3 * b)
            top, left = rng.integers(0, 33, size=2)
            crops = images[idx[:b], :, top : top + 32, left : left + 32]
            total = 0.0
            for batch in (crops, resize(images[idx[b : 2 * b]], 32), resize(images[idx[2 * b :]], 16)):
                x = batch.to(self.device) * 2 - 1
                latents = vq.encode(x).latents
                quant, commit_loss, (_, _, codes) = vq.quantize(latents)
                recon = vq.decode(quant, force_not_quantize=True).sample
                total = total + F.mse_loss(recon, x) + 0.5 * F.l1_loss(recon, x) + commit_loss
                if batch is crops:
                    recent.update(latents=latents.detach(), codes=codes.detach())
            return total

        usage = torch.zeros(VQ_CONFIG["num_vq_embeddings"], device=self.device)

        def restart_dead_codes(step):
            # Codes no batch has used for 100 steps move to random current encoder outputs.
            with torch.no_grad():
                codes = recent["codes"].reshape(-1)
                usage.mul_(0.99).index_add_(0, codes, torch.ones(codes.numel(), device=self.device))
                if (step + 1) % 100 == 0:
                    dead = (usage < 0.05).nonzero()[:, 0]
                    if len(dead):
                        lat = recent["latents"].permute(0, 2, 3, 1).reshape(-1, recent["latents"].shape[1])
                        pick = torch.randint(len(lat), (len(dead),), device=self.device)
                        vq.quantize.embedding.weight[dead] = lat[pick]
                        usage[dead] = 1.0

        stats = train(
            "vq",
            vq,
            loss_fn,
            self.budget.vq_steps,
            self.run / "vq.ckpt",
            lr=1e-3,
            every=self.budget.checkpoint_every,
            on_step=restart_dead_codes,
        )
        torch.save(vq.state_dict(), self.run / "vq.pt")
        self.record("vq", **stats, **self.vq_quality(vq))

    def load_vq(self) -> VQModel:
        vq = build_vq()
        vq.load_state_dict(torch.load(self.run / "vq.pt", map_location="cpu", weights_only=True))
        return vq.to(self.device).eval()

    @torch.no_grad()
    def vq_quality(self, vq) -> dict:
        from mulo.eval.ceilings import upsampling_agreement
        from mulo.models.upsample import PixelUpsampler
        from mulo.models.vq import VQTokenizer

        tok = VQTokenizer(vq.eval())
        val = to_float(self.data.images[self.data.is_val])
        out = {}
        for size in (64, 32, 16):
            x = resize(val, size).to(self.device)
            if size == 64:
                x64 = x
            codes = tok.encode(x)
            mse = float(((tok.decode(codes) - x) ** 2).mean())
            out[f"val_psnr_{size}px"] = round(10 * np.log10(1 / max(mse, 1e-10)), 2)
            out[f"codes_used_{size}px"] = int(codes.unique().numel())
        # What a perfect drafter could get accepted at k = 0: the share of the 64 px codes that the
        # pixel up-sampler (whole image at once) reproduces from the 64 / r px encoding, and, for
        # comparison, from the 64 / r px image itself with no low-res VQ.
        for r in (2, 4):
            shares = upsampling_agreement(tok, PixelUpsampler(tok, r), x64, r)
            out[f"val_draft_agreement_r{r}"] = round(shares["from_tokens"], 4)
            out[f"val_resize_agreement_r{r}"] = round(shares["from_pixels"], 4)
        return out

    @torch.no_grad()
    def stage_tokens(self) -> None:
        from mulo.models.vq import VQTokenizer

        d = self.data
        tok = VQTokenizer(self.load_vq())
        clip = self.load_clip()
        images = to_float(d.images)
        grids = {}
        for size in (64, 32, 16):
            parts = [
                tok.encode(resize(images[i : i + 256], size).to(self.device)).cpu() for i in range(0, len(images), 256)
            ]
            grids[f"tokens{size}"] = torch.cat(parts).numpy().astype(np.int16)
        # Short prompts are shared between images ("face" for 170 of them): features once per
        # phrase, and per image a slice short_ids[short_ptr[i] : short_ptr[i + 1]] into them.
        phrases = list(dict.fromkeys(p for ps in d.short_prompts for p in ps))
        index = {p: j for j, p in enumerate(phrases)}
        short_ids = np.array([index[p] for ps in d.short_prompts for p in ps], dtype=np.int32)
        short_ptr = np.cumsum([0, *map(len, d.short_prompts)])
        conds = {}
        for name, texts in (("cond_name", d.names), ("cond_text", d.texts), ("cond_short", phrases)):
            ids = clip.tokenizer.batch(texts)
            conds[name] = torch.cat(
                [clip.condition_features(ids[i : i + 512].to(self.device)).cpu() for i in range(0, len(ids), 512)]
            )
            conds[name] = conds[name].numpy().astype(np.float16)
        np.savez(self.run / "tokens.npz", **grids, **conds, short_ids=short_ids, short_ptr=short_ptr, is_val=d.is_val)

    def stage_ar(self, stage: str) -> None:
        z = np.load(self.run / "tokens.npz")
        if "cond_short" not in z.files:
            raise RuntimeError(
                f"{self.run / 'tokens.npz'} predates short prompts: delete it to rebuild the tokens stage"
            )
        side = GRIDS[stage]
        tokens = torch.from_numpy(z[f"tokens{side * 4}"].astype(np.int64)).reshape(len(z["is_val"]), -1)
        cond_name, cond_text, cond_short = (
            torch.from_numpy(z[k].astype(np.float32)) for k in ("cond_name", "cond_text", "cond_short")
        )
        short_ids, short_ptr = z["short_ids"], z["short_ptr"]
        is_val = z["is_val"]
        vocab = VQ_CONFIG["num_vq_embeddings"]
        cfg = gpt_config(stage, vocab, cond_name.shape[-1])
        torch.manual_seed(self.seed + GRIDS[stage])
        model = GPT(cfg)
        model.apply(_init_weights)
        torch.nn.init.normal_(model.abs_pe, std=0.02)
        model.to(self.device)
        train_idx = np.flatnonzero(~is_val)
        # Every emoji equally likely, its skin-tone variants sharing its weight: variants are
        # 58 % of the images but near-duplicates, and the base emoji are what prompts ask for.
        group = np.unique(np.array(self.data.keys)[train_idx], return_inverse=True, return_counts=True)
        weights = 1.0 / group[2][group[1]]
        weights /= weights.sum()
        rng = self.rng(stage)
        batch = self.budget.ar_batch
        steps = {"target": self.budget.ar_steps, "draft_model": self.budget.draft_model_steps}.get(
            stage, self.budget.drafter_steps
        )

        def text_condition(i: int, kind: str) -> torch.Tensor:
            n_short = short_ptr[i + 1] - short_ptr[i]
            if kind == "description":
                return cond_text[i]
            if kind == "short" and n_short:  # one of the image's short prompts, uniformly
                return cond_short[short_ids[short_ptr[i] + rng.integers(n_short)]]
            return cond_name[i]  # the name (also for images without a short prompt, "rocket")

        def loss_fn(step):
            idx = rng.choice(train_idx, size=min(batch, len(train_idx)), replace=False, p=weights)
            mix = self.budget.ar_text_mix
            kinds = rng.choice(list(mix), size=len(idx), p=list(mix.values()))
            cond = torch.stack([text_condition(i, kind) for i, kind in zip(idx, kinds, strict=True)])
            drop = torch.from_numpy(rng.random(len(idx)) < CFG_DROPOUT)[:, None, None]
            cond = cond.masked_fill(drop, 0.0)  # the null condition is all-zero features
            x = tokens[idx].to(self.device)
            inputs = x[:, :-1]
            noisy = self.budget.input_noise > 0 and step >= self.budget.input_noise_from * steps
            if noisy:  # noisy teacher forcing: predict the clean token anyway
                noise = torch.from_numpy(rng.random(inputs.shape) < self.budget.input_noise).to(self.device)
                random_codes = torch.from_numpy(rng.integers(0, vocab, size=inputs.shape)).to(self.device)
                inputs = torch.where(noise, random_codes, inputs)
            with autocast(self.device):
                logits = model(inputs, cond.to(self.device))
            return F.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1))

        stats = train(
            stage,
            model,
            loss_fn,
            steps,
            self.run / f"{stage}.ckpt",
            lr=1.5e-3 if stage != "draft_model" else 2e-3,
            every=self.budget.checkpoint_every,
        )
        with torch.no_grad():
            val = np.flatnonzero(is_val)
            x = tokens[val].to(self.device)
            logits = model(x[:, :-1], cond_name[val].to(self.device))
            val_loss = float(F.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1)))
        torch.save(model.state_dict(), self.run / f"{stage}.pt")
        (self.run / f"{stage}.json").write_text(json.dumps(asdict(cfg)))
        self.record(stage, **stats, val_loss=round(val_loss, 4), params=sum(p.numel() for p in model.parameters()))

    def stage_upsampler(self, r: int) -> None:
        z = np.load(self.run / "tokens.npz")
        high = torch.from_numpy(z["tokens64"].astype(np.int64))
        low = torch.from_numpy(z[f"tokens{64 // r}"].astype(np.int64))
        is_val = z["is_val"]
        torch.manual_seed(self.seed + r)
        up = TokenUpsampler(VQ_CONFIG["num_vq_embeddings"], r, width=128, depth=3).to(self.device)
        train_idx = np.flatnonzero(~is_val)
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
            "data": (
                lambda: self.record("data", images=len(self.data.names), val=int(self.data.is_val.sum())),
                "report.json",
            ),
            "clip": (self.stage_clip, "clip.pt"),
            "vq": (self.stage_vq, "vq.pt"),
            "tokens": (self.stage_tokens, "tokens.npz"),
            "target": (lambda: self.stage_ar("target"), "target.pt"),
            "drafter_r2": (lambda: self.stage_ar("drafter_r2"), "drafter_r2.pt"),
            "drafter_r4": (lambda: self.stage_ar("drafter_r4"), "drafter_r4.pt"),
            "draft_model": (lambda: self.stage_ar("draft_model"), "draft_model.pt"),
            "upsampler_r2": (lambda: self.stage_upsampler(2), "upsampler_r2.pt"),
            "upsampler_r4": (lambda: self.stage_upsampler(4), "upsampler_r4.pt"),
            "export": (self.export, None),
            "card": (self.card, None),
        }

    def run_all(self, only: list[str] | None = None) -> dict:
        for name, (fn, output) in self.stages().items():
            if only and name not in only:
                continue
            if output and (self.run / output).exists() and name in self.report:
                log.info("stage %s: done already", name)
                continue
            log.info("stage %s", name)
            start = time.perf_counter()
            fn()
            self.record(name, stage_seconds=round(time.perf_counter() - start, 1))
        return self.report

    def export(self) -> None:
        from safetensors.torch import save_file

        self.assets.mkdir(parents=True, exist_ok=True)

        def save(name: str, state: dict, config: dict) -> None:
            half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}
            save_file(half, self.assets / f"{name}.safetensors")
            (self.assets / f"{name}.json").write_text(json.dumps(config, indent=1))

        load = lambda name: torch.load(self.run / f"{name}.pt", map_location="cpu", weights_only=True)  # noqa: E731
        clip_vocab = json.loads((self.run / "clip_vocab.json").read_text())
        save("clip", load("clip"), {"vocab": clip_vocab, "max_len": COND_LEN})
        save("vq", load("vq"), {k: list(v) if isinstance(v, tuple) else v for k, v in VQ_CONFIG.items()})
        for stage in ("target", "drafter_r2", "drafter_r4", "draft_model"):
            save(stage, load(stage), json.loads((self.run / f"{stage}.json").read_text()))
        for r in (2, 4):
            save(
                f"upsampler_r{r}",
                load(f"upsampler_r{r}"),
                {"vocab_size": VQ_CONFIG["num_vq_embeddings"], "r": r, "width": 128, "depth": 3},
            )
        (self.assets / "training_report.json").write_text(json.dumps(self.report, indent=1))
        (self.assets / "defaults.json").write_text(json.dumps(DEFAULTS, indent=1))
        (self.assets / "aliases.json").write_text(json.dumps(data_mod.aliases(self.data), indent=0))

    def card(self) -> None:
        from mulo.families import twemoji as family_mod
        from mulo.train import card

        engine = Engine(family_mod.build(self.assets).to(self.device))
        metrics = card.evaluate(engine, self.data, self.load_clip(), self.assets, self.budget.eval_prompts)
        (self.assets / "metrics.json").write_text(json.dumps(metrics, indent=1))
        self.write_card(metrics)

    def write_card(self, metrics: dict) -> None:
        """MODEL_CARD.md from the report and ``metrics`` (rewritable without re-evaluating)."""
        from mulo.train import card

        sizes = {p.name: round(p.stat().st_size / 2**20, 2) for p in sorted(self.assets.glob("*.safetensors"))}
        sizes["total"] = round(sum(sizes.values()), 2)
        recipe = dict(
            vq=VQ_CONFIG, target=TARGET, draft_model=DRAFT_MODEL, cfg_dropout=CFG_DROPOUT, name_text_prob=NAME_TEXT_PROB
        )
        card.write_model_card(self.assets, self.report, metrics, asdict(self.budget), sizes, recipe)


def _init_weights(module) -> None:
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        torch.nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            torch.nn.init.zeros_(module.bias)


def autocast(device: str):
    """bf16 autocast where the hardware runs bf16 matmuls natively (CUDA; CPUs with AVX512-BF16
    or AMX, 1.6x faster per AR training step on our 2-core EPYC); plain fp32 elsewhere."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    cpu_bf16 = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or cpu_bf16)


def hardware(device: str) -> str:
    import platform

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def run(run_dir="runs/twemoji", assets="assets/twemoji", smoke=False, device="cpu", only=None, cache=None) -> dict:
    budget = SMOKE if smoke else FULL
    return Pipeline(Path(run_dir), Path(assets), replace(budget), device, cache=cache).run_all(only)
