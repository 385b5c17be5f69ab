"""What each emoji recipe (``twemoji``, ``twemoji-64``, ``emoji``, ``emoji-16``, ``scenes``) is
trained to: geometry, architectures, budgets, each stage's learning rate and sizes, knob defaults,
the VQ study's rule (``mulo.train.pipeline`` runs them; docs/training.md).

Each chosen value carries one line of why, and where it was measured; the measurements behind
them, in the order they were made, are in docs/notebook/recipes-calibration.md."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mulo.models.gpt import GPTConfig
from mulo.train.scenes import SceneConfig

COND_LEN = 16

VQ_CONFIG = dict(
    block_out_channels=(32, 64, 64),
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    layers_per_block=1,
    latent_channels=32,
    num_vq_embeddings=32,  # a coarse codebook lets a draft name the high-res code (docs/twemoji-64/MODEL_CARD.md)
    vq_embed_dim=8,
    norm_num_groups=16,
    mid_block_add_attention=False,
    sample_size=64,
)
TARGET = dict(dim=256, n_layer=4, n_head=4, multiple_of=64)
DRAFT_MODEL = dict(dim=96, n_layer=2, n_head=2, multiple_of=32)  # about 1/8 of the target
# Recommended knob values written to defaults.json, measured on twemoji-64 (docs/twemoji-64/MODEL_CARD.md,
# History; docs/notebook/recipes-calibration.md#the-twemoji-64-defaults-and-budget).
DEFAULTS = {
    "cfg": 1.0,  # no guidance: it pushes these memorising models off the images they know
    "top_p": 0.8,  # at cfg 1 it doubled AR adherence on 40 prompts (0.48 against 0.23)
    "tau": 0.1,  # the target's probabilities are near 0 or large: a smaller tau accepts the same share
    "k": 0,  # no pooling: a pooled neighbour the memorising target gives ~0 probability derails it
    "radius": 2,  # the paper's protocol: the smallest radius at which MuLo-SD keeps AR's quality
    "rows_per_block": 8,  # the whole low-res image in one round: the VQ encoder sees below a row strip
}
NAME_TEXT_PROB = 0.6  # mini-CLIP text augmentation: the emoji's name, else its full description
CFG_DROPOUT = 0.1


@dataclass
class Budget:
    images: int | None = None  # limit the data set (smoke runs)
    clip_steps: int = 600
    clip_batch: int = 128
    vq_steps: int = 1200
    vq_batch: int = 16
    ar_steps: int = 3600  # the target
    drafter_steps: int = 2000  # each low-res drafter
    ar_batch: int = 32
    draft_model_steps: int = 1700
    upsampler_steps: int = 800
    upsampler_batch: int = 64
    checkpoint_every: int = 100
    eval_prompts: int = 120
    # AR text augmentation: the name, a short prompt (one short name alone, "pizza" for "slice of
    # pizza", or one content word of the name, "sun" for "sun with face"), or the full description.
    # No short prompts: too few sightings to learn, and they cost adherence to names (twemoji-64's card)
    ar_text_mix: dict = field(default_factory=lambda: {"name": 0.6, "short": 0.0, "description": 0.4})
    # AR noisy teacher forcing: fraction of input tokens replaced by random codes, from this
    # fraction of each stage's steps on. Off: it undid the target's memorisation (twemoji-64's card)
    input_noise: float = 0.0
    input_noise_from: float = 0.625
    # what replaces a noisy input: "codes" (any code, uniformly) or "scene" (a token of the same
    # sequence: the background, or another object's piece, the kind of miss a model makes)
    input_noise_kind: str = "codes"
    # Parallel-decoding tolerance: the share of target and drafter steps whose attention mask hides,
    # from each token, what ZipAR with a random window has not produced yet (``zipar_mask``), so
    # one target serves raster AR, ZipAR and ZipAR inside MuLo-SD's islands.
    zipar_share: float = 0.0
    zipar_windows: tuple[int, ...] = (2, 4, 8, 16)
    # In the target's ZipAR steps, the loss of each row's first token that ZipAR predicts from a
    # proxy (``zipar.proxied_targets``) weighs ``proxy_weight``: the one prediction ZipAR makes from
    # an input that is not its slot's token.
    proxy_weight: float = 1.0
    oracle_images: int = 96  # validation emoji in the VQ study's oracle MuLo-SD
    # EAGLE-2's draft head: steps, batch, the uniform noise on the target features it reads
    # (EAGLE's: the head feeds on its own imperfect predictions when it drafts), and the weight of
    # its next-token loss beside the feature regression (EAGLE's 0.1).
    eagle_steps: int = 1500
    eagle_batch: int = 16
    eagle_noise: float = 0.1
    eagle_cls_weight: float = 0.1
    # Multi-style data (``mulo.train.styles``): augmented copies of each training image (shrunk and
    # moved inside the canvas) encoded beside it in the tokens stage.
    augment_copies: int = 0
    # Model selection: every ``validate_every`` steps the AR stages measure their loss on the
    # held-out (emoji, style) pairs and keep the best weights (0: keep the last, as before).
    validate_every: int = 0
    weight_decay: float = 0.01
    # Scenes (``Recipe.scenes``): held-out-combination scenes in the validation split (``images``
    # counts the training scenes the clip and VQ stages hold; the AR stages draw fresh ones).
    held_out_scenes: int = 0
    scene_chunk: int = 1024  # training scenes encoded together into one file of the run folder
    # The AR stages' loss on every token but the background's (a row's most common token) and on
    # this share of the background's, weighted up (``stages.ar.background_sample``): the output
    # head, the biggest layer at 2,048+ codes, then runs on ~1/4 of a scene's positions. 1: all.
    background_loss_share: float = 1.0
    # Scenes: the loss weight of the open cells (``stages.ar.open_cells``: no object token within an
    # object's reach above or to the left), where the next token either begins an object, which one
    # the prompt says, or stays background: the model's few real decisions, ~2 tokens an object of 64.
    # A weight by context only, so the conditionals the loss is least at stay the data's. 1: off.
    open_weight: float = 1.0
    # Scenes: the loss weight of the cells up to a scene's first object token (raster order), where
    # nothing has begun yet, so an object must begin by the last row one fits. A weight by context
    # only, as ``open_weight``. 1: off.
    first_start_weight: float = 1.0


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
    eagle_steps=3,
    eagle_batch=4,
    checkpoint_every=2,
    eval_prompts=2,
    input_noise=0.1,
    input_noise_from=0.0,
    ar_text_mix={"name": 0.5, "short": 0.2, "description": 0.3},  # every kind of text on the smoke run
)
# The 32x32 budget, sized for a GPU (``--device cuda``; on 2 cores the plan is days), one cosine
# (docs/notebook/recipes-calibration.md#the-3232-budget-full_128; assets/twemoji/MODEL_CARD.md, History).
FULL_128 = replace(
    FULL,
    ar_steps=40000,  # 5x the second CPU run's sequences: at its step 8,400 AR drew adherence 0.05
    zipar_share=0.5,  # half the steps under ZipAR's mask, so one target serves AR, ZipAR and islands
    proxy_weight=8.0,  # a row's first token, drawn from ZipAR's proxy: where the first run's ZipAR left its emoji
    drafter_steps=12000,
    draft_model_steps=6000,
    upsampler_steps=3000,
    eagle_steps=6000,
    checkpoint_every=500,  # a GPU step takes milliseconds, a checkpoint write ~0.1 s
)


def vq_config(codes: int, patch: int = 4, **overrides) -> dict:
    """``VQ_CONFIG`` with ``codes`` codes over ``patch``-pixel patches: each block after the first
    halves the image, so 4-px patches take three blocks and 8-px ones a fourth, as wide as the last.
    ``overrides``: other ``VQModel`` arguments (a recipe's ``vq_model``). The decoder's spatial
    normalisation (``norm_type="spatial"``) modulates every norm by the quantised latents, which
    diffusers takes at ``latent_channels`` dims: the codebook's vectors get as many. ``fold=f``
    (2 or 4): a folded VQ (``mulo.models.vq``), f x f pixels a position, one block fewer per halving
    it saves (f = 4 at 4-px patches: one block, every layer at the token grid). ``kind="patches"``:
    no ``VQModel`` but a k-means codebook of pixel squares (``mulo.models.patch_vq``)."""
    if overrides.get("kind") == "patches":  # a codebook of pixel squares (``mulo.models.patch_vq``)
        return {"kind": "patches", "patch": patch, "codes": codes}
    config = {**VQ_CONFIG, **overrides}
    fold = config.pop("fold", 1)  # a folded VQ (``mulo.models.vq``): f x f pixels a position
    blocks = patch.bit_length()
    if patch < 4 or patch != 2 ** (blocks - 1):
        raise ValueError(f"the VQ's patch must be a power of two of at least 4 pixels, not {patch}")
    if fold not in (1, 2, 4) or fold > patch:
        raise ValueError(f"a VQ folds 1, 2 or 4 pixels a side into channels, at most its patch, not {fold}")
    blocks -= fold.bit_length() - 1
    config.update(in_channels=3 * fold * fold, out_channels=3 * fold * fold)
    channels = tuple(config["block_out_channels"])
    if len(channels) > blocks:
        raise ValueError(f"{len(channels)} block widths {channels} for a VQ of {blocks} blocks")
    channels = channels + channels[-1:] * (blocks - len(channels))
    config.update(
        block_out_channels=channels,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        num_vq_embeddings=codes,
    )
    if config.get("norm_type") == "spatial":
        config["vq_embed_dim"] = config["latent_channels"]
    return config


@dataclass(frozen=True)
class Hyper:
    """What a recipe's budgets share: each stage's peak learning rate (``loop.train``'s AdamW),
    the up-samplers' size and the VQ's loss. Not in ``Budget``: the model card prints the budget
    as it is, and these never changed between a full and a smoke run."""

    clip_lr: float = 1e-3
    clip_shift: int = 3  # mini-CLIP's translation augmentation: up to this many pixels each way
    style_word_prob: float = 0.5  # styled data: how often a name-only CLIP text ends with its style word
    vq_lr: float = 1e-3
    vq_l1_weight: float = 0.5  # VQ loss: MSE + this x L1 + commitment
    vq_crop: int = 32  # the VQ trains on images above this size as random crops of it
    # A tiled VQ (tools/experiments/scenes_vq.py's): it trains on ``vq_tile`` px windows and reads and
    # draws every image as such tiles (``VQTokenizer``'s ``tile``), so inference sees what training saw;
    # 0: whole images. ``vq_busy``: the share of a batch's windows drawn among those holding part of an
    # object (for a codebook of squares: of the squares k-means sees, those not one flat colour).
    vq_tile: int = 0
    vq_busy: float = 0.0
    vq_restart_every: int = 100  # steps between dead-code restarts
    # A codebook of pixel squares (``vq_model={"kind": "patches"}``): k-means over this many squares
    # of the training images at the three sizes, ``vq_busy`` of them not one flat colour
    patch_squares: int = 300_000
    patch_iterations: int = 15
    # the AR models' position embedding at step 0: "normal" (random, every slot its own) or "grid"
    # (row + column sinusoids, ``stages.ar.init_positions``)
    pe_init: str = "normal"
    # the token embeddings and output rows at step 0: "normal", or "pixels" (a codebook of squares:
    # each code from the pixels it draws, ``stages.ar.init_from_pixels``)
    embed_init: str = "normal"
    ar_lr: float = 1.5e-3  # the target and the drafters
    draft_model_lr: float = 2e-3
    upsampler_lr: float = 2e-3
    upsampler_width: int = 128
    upsampler_depth: int = 3
    upsampler_context: str = "rows"  # ``TokenUpsampler``'s: "rows" (row-causal) or "block"
    eagle_lr: float = 1e-3


SCENE_CONDITIONS = ("clip", "symbols", "placed", "clip_placed")


@dataclass(frozen=True)
class Recipe:
    """One family's geometry and training plan."""

    family: str
    px: int  # the target's image size; the r = 2 and r = 4 drafters see px/2 and px/4
    svg: bool  # images rendered from the Twemoji SVGs at each size (else the 64 px PNGs, resized)
    vq_codes: tuple[int, ...]  # codebook sizes trained; with several, the oracle MuLo-SD picks one
    budget: Budget
    smoke: Budget
    defaults: dict
    target: dict = field(default_factory=lambda: dict(TARGET))
    draft_model: dict = field(default_factory=lambda: dict(DRAFT_MODEL))
    styles: tuple[str, ...] = ()  # multi-style data: the style words (``mulo.train.styles``); () = Twemoji only
    hyper: Hyper = field(default_factory=Hyper)
    int8_models: tuple[str, ...] = ()  # exported as int8 + row scales (``mulo.families.int8``), to fit assets/
    patch: int = 4  # the VQ's patch side in pixels: the target's grid is px / patch tokens a side
    # Composed scenes (``mulo.train.scenes``) instead of a data set of emoji images: the AR,
    # up-sampler and EAGLE stages draw fresh scenes by index (``stages/scene_tokens.py``)
    scenes: SceneConfig | None = None
    # ``VQModel`` arguments other than ``VQ_CONFIG``'s, or {"kind": "patches"}: a k-means codebook of
    # pixel squares instead (``mulo.models.patch_vq``; ``Hyper.patch_*``)
    vq_model: dict = field(default_factory=dict)
    # How a scenes family's models read a prompt: "clip" (the mini-CLIP's word features),
    # "symbols" (its background, names and styles as one-hot slots, ``mulo.scenes.symbol_slots``) or
    # "placed" (those slots by object count and place, their keys turned to their columns by a
    # rotary model: ``GPTConfig.condition_columns``; scenes in columns) or "clip_placed" (the
    # mini-CLIP's features, and the placed symbols added at every slot by its column:
    # ``GPTConfig.column_objects``; scenes in columns)
    scene_condition: str = "clip"

    def __post_init__(self):
        if self.scene_condition not in SCENE_CONDITIONS:
            raise ValueError(
                f"scene_condition must be one of {', '.join(map(repr, SCENE_CONDITIONS))}, not {self.scene_condition!r}"
            )
        if self.scene_condition.endswith("placed") and getattr(self.scenes, "placement", None) != "columns":
            raise ValueError(
                f"scene_condition {self.scene_condition!r} reads objects by their column: it needs scenes in columns"
            )

    @property
    def sizes(self) -> tuple[int, int, int]:
        return (self.px, self.px // 2, self.px // 4)

    def grid(self, stage: str) -> int:
        """Side of ``stage``'s token grid."""
        side = self.px // self.patch
        return {"target": side, "drafter_r2": side // 2, "drafter_r4": side // 4, "draft_model": side}[stage]

    def condition_width(self, feature_width: int) -> int:
        """The width of a condition row of this recipe's models, for text features ``feature_width``
        wide: wider by the placed symbols' channels under ``clip_placed``."""
        if self.scene_condition != "clip_placed":
            return feature_width
        return feature_width + len(self.scenes.names) + len(self.scenes.backgrounds) + len(self.scenes.styles)

    def gpt_config(self, stage: str, vocab: int, cond_dim: int) -> GPTConfig:
        """``stage``'s model for a codebook of ``vocab`` and conditions ``cond_dim`` wide (all of a
        condition row: ``condition_width``)."""
        side = self.grid(stage)
        sizes = dict(self.draft_model if stage == "draft_model" else self.target)
        if self.scene_condition == "placed" and sizes.get("rotary_2d"):
            sizes["condition_columns"] = self.scenes.max_objects
        if self.scene_condition == "clip_placed":  # the condition's last channels: the placed symbols
            symbols = self.condition_width(0)
            sizes.update(column_objects=self.scenes.max_objects, column_symbols=symbols)
            cond_dim -= symbols
        return GPTConfig(vocab_size=vocab, max_seq_len=side * side, cond_len=COND_LEN + 1, cond_dim=cond_dim, **sizes)


# The VQ study's rule: the codebook whose perfect drafter leaves MuLo-SD the most room, the
# sequential-pass bound at the paper's r = 2 setting (radius 1, no pooling, ZipAR with window 8
# inside the islands), among the codebooks that reconstruct the target's images within
# PSNR_SLACK dB of the best candidate (a smaller codebook is always easier to draft, and at
# some size no longer draws the emoji).
STUDY_SETTING = {"r": 2, "k": 0, "l": 1}
STUDY_BOUND = "speedup_zipar_w8"
PSNR_SLACK = 1.5
# Scenes: a codebook must also keep the referee's prompt match on its reconstructions of held-out
# scenes at this share (issue 63); when none does, only the best of them is a candidate.
REFEREE_BAR = 0.98


def choose_codebook(study: dict[str, dict]) -> int:
    """The codebook size (``study``: size -> its VQ's report with ``oracle`` rows) by the rule above."""
    psnr = {codes: next(v for k, v in entry.items() if k.startswith("val_psnr_")) for codes, entry in study.items()}
    good = [codes for codes, value in psnr.items() if value >= max(psnr.values()) - PSNR_SLACK]
    referee = {codes: entry["val_referee_match"] for codes, entry in study.items() if "val_referee_match" in entry}
    if referee:
        passing = [codes for codes in good if referee[codes] >= REFEREE_BAR]
        good = passing or [max(referee, key=referee.get)]

    def bound(codes: str) -> float:
        rows = study[codes]["oracle"]
        return next(row[STUDY_BOUND] for row in rows if all(row[k] == v for k, v in STUDY_SETTING.items()))

    return int(max(good, key=bound))


RECIPES = {
    "twemoji": Recipe(
        "twemoji",
        px=128,
        svg=True,
        vq_codes=(16, 32, 64),
        budget=FULL_128,
        smoke=replace(SMOKE, zipar_share=0.5, proxy_weight=8.0, oracle_images=4),
        # measured in docs/notebook/twemoji-families.md#calibration and the section after it:
        # rows_per_block 16: every low-res row in one round at r = 2 (16 rows) and r = 4 (8);
        # radius 3: the only radius that kept AR's quality in `calibrate` (24 prompts);
        # ZipAR drafting and island_window 8: at radius 3 they score whole-grid ZipAR w8's adherence;
        # the up-sampler: picked by the data (Pipeline.defaults).
        defaults={**DEFAULTS, "rows_per_block": 16, "radius": 3, "drafting": "zipar", "island_window": 8},
    ),
    "twemoji-64": Recipe(
        "twemoji-64",
        px=64,
        svg=False,
        vq_codes=(32,),
        budget=FULL,
        smoke=SMOKE,
        defaults={**DEFAULTS, "upsampler": "pixel"},
    ),
}


# The multi-style family (issue 38): twemoji's geometry on ~17,000 images, five styles of ~1,900
# emoji, so every prompt has several right answers and the target must generalise. A 6-layer target
# with dropout and more weight decay, kept at its best held-out-pair loss; width 256 keeps every
# shipped file under 10 MB (5.2 M parameters, 9.9 MB in fp16). Sized for a GPU; a first plan, not
# a study's outcome (docs/notebook/recipes-calibration.md#the-emoji-recipe-issue-38).
EMOJI_TARGET = dict(dim=256, n_layer=6, n_head=4, multiple_of=64, dropout=0.1)
EMOJI_DRAFT_MODEL = dict(DRAFT_MODEL, dropout=0.1)
FULL_EMOJI = replace(
    FULL_128,
    augment_copies=4,
    # the name alone (any style), the name with its style word, or the whole description
    ar_text_mix={"name": 0.35, "name_style": 0.35, "description": 0.3},
    validate_every=1000,
    weight_decay=0.05,
    vq_steps=4000,
    clip_steps=2000,
)
RECIPES["emoji"] = Recipe(
    "emoji",
    px=128,
    svg=True,
    vq_codes=(32, 64, 128),
    budget=FULL_EMOJI,
    smoke=replace(
        SMOKE,
        images=60,
        augment_copies=1,
        ar_text_mix={"name": 0.3, "name_style": 0.4, "description": 0.3},
        validate_every=2,
        weight_decay=FULL_EMOJI.weight_decay,
        zipar_share=FULL_EMOJI.zipar_share,
        oracle_images=4,
    ),
    # twemoji's defaults until the family is trained and calibrated (the paper's protocol)
    defaults=dict(RECIPES["twemoji"].defaults),
    target=EMOJI_TARGET,
    draft_model=EMOJI_DRAFT_MODEL,
    styles=("twemoji", "noto", "openmoji", "fluent", "fluentcolor"),
)

# Issue 46's first study candidate (a): the multi-style data at 16x16 target tokens on 64 px renders
# (drafters 8x8 at r = 2 and 4x4 at r = 4), sized for this 2-core CPU: one training sequence is
# 256 tokens, a quarter of the 32x32 family's, so the whole family fits the 8 CPU-hours.
# The same target as ``emoji``. How its step counts were set, session by session:
# docs/notebook/recipes-calibration.md#emoji-16s-target-steps and the section after it.
CPU_EMOJI_16 = replace(
    FULL_EMOJI,
    clip_steps=1000,
    vq_steps=1500,
    # three cosines (to 5700, 8000, 10500), the held-out-pair loss still falling at each; best at 10000
    ar_steps=10500,
    # the plan: session 3's cuts (600, 500, 300, 400) drafted worse, so session 7 retrained at these
    drafter_steps=1500,
    draft_model_steps=1500,
    upsampler_steps=800,
    eagle_steps=1000,
    validate_every=100,
    checkpoint_every=50,  # a CPU step takes seconds: a resume point every few minutes
    zipar_share=0.5,
    proxy_weight=8.0,
)
RECIPES["emoji-16"] = replace(
    RECIPES["emoji"],
    family="emoji-16",
    px=64,
    vq_codes=(32, 64),
    budget=CPU_EMOJI_16,
    # measured in docs/notebook/recipes-calibration.md#emoji-16s-defaults (sessions 4-12):
    # cfg 5: better FD and adherence than 3 at two seeds (benchmarks/sampling-emoji-16.json);
    # top_p 0.95: whole shapes where twemoji's 0.8 cut objects off (step 2800); 0.8 worse at cfg 5 too;
    # tau 0.01, k 1: the fastest that keep AR's quality at three seeds (calibration-emoji-16-seeds.json);
    # radius 3: the fastest radius that keeps it at three seeds (seeds-emoji-16-radius.json);
    # island_window 4, drafting zipar: the protocol on 120 prompts (calibration-emoji-16-120.json);
    # upsampler pixel: lower FD than the learned one at these knobs (calibration-emoji-16-retrained.json).
    defaults={**DEFAULTS, "rows_per_block": 8, "cfg": 5.0, "top_p": 0.95}
    | {"tau": 0.01, "k": 1, "radius": 3, "island_window": 4, "drafting": "zipar", "upsampler": "pixel"},
    # float16 (37 MB) beside twemoji (30) would not fit assets/' 60 MB; int8 AR models: ~22 MB
    int8_models=("target", "drafter_r2", "drafter_r4", "draft_model", "eagle_head"),
)

# Issue 46's study candidate (b): emoji-16's 16x16 target sequences over 128 px renders, a VQ of
# 8-px patches and 256 codes; it shares emoji-16's mini-CLIP, so reconstructions are scored alike.
# Not trained: the VQ alone ruled it out (docs/notebook/emoji-family.md, session 13).
RECIPES["emoji-16-128"] = replace(
    RECIPES["emoji-16"],
    family="emoji-16-128",
    px=128,
    patch=8,
    vq_codes=(256,),
    budget=replace(CPU_EMOJI_16, ar_steps=3000),
)

STAGES = ("data", "clip", "vq", "tokens", "target", "drafter_r2", "drafter_r4", "draft_model")
STAGES += ("upsampler_r2", "upsampler_r4", "eagle", "export", "card")

# The emoji scenes family (issue 63): 128 px scenes of one palette background and 1 to 3 emoji of
# 32 px from a vocabulary of 64 in five styles (``mulo.scenes``, ``mulo.train.scenes``), at
# twemoji's geometry (32x32 target tokens of 4 px; drafters 16x16 at r = 2 and 8x8 at r = 4), with
# its own VQ: twemoji's reconstructions keep the referee at 0.04 (benchmarks/scenes-referee.json).
# Sized by measured step times (below the budget): a narrow target (128) that sees every scene once.
# Every model reads the row above (``GPTConfig.neighbour_inputs``): with it the target's held-out
# object tokens reached 64 % top-1 after 800 steps, against 27 % after 1,050 without
# (docs/notebook/session-2026-11-29-neighbours.md).
# And attention turns by 2D cell (``rotary_2d``): a target with learnt positions only drew chimeras
# after 7,000 steps (every object token's top-1 given the true last two rows, none from further up:
# it had become a local texture model, docs/notebook/session-2026-11-29-rotary.md); at 800 steps on
# 8 emoji, the same scenes, the rotary target's held-out object loss was 0.470 against 0.602.
SCENES_TARGET = dict(dim=128, n_layer=4, n_head=2, multiple_of=64, neighbour_inputs=3, rotary_2d=True)
SCENES_DRAFT_MODEL = dict(dim=64, n_layer=2, n_head=2, multiple_of=32, neighbour_inputs=3)
FULL_SCENES = replace(
    FULL,
    images=3072,  # training scenes the clip and VQ stages hold (~200 MB at the three sizes)
    held_out_scenes=512,
    clip_steps=1000,
    vq_steps=1200,
    # 320,000 fresh scenes at 16 a batch: a second cosine from step 11,000 took AR from 22 (at 10,000
    # steps) to 39 of 101 named objects on 48 prompts (docs/notebook/session-2026-12-01-target.md).
    ar_steps=20000,
    ar_batch=16,
    background_loss_share=0.1,
    drafter_steps=17000,  # cosines of 6,000, 12,000, 17,000 (restarts at 7,000, 12,000): drafter notebook
    draft_model_steps=2000,
    upsampler_steps=1500,  # 96,000 scenes: what the target's first 6,000 steps read
    eagle_steps=1000,
    checkpoint_every=50,  # a CPU step takes seconds: a resume point every few minutes
    validate_every=250,
    oracle_images=32,
    # the prompt, the prompt without its background ("red apple and rocket": any background), or the
    # description that names each object's style
    ar_text_mix={"name": 0.6, "short": 0.15, "description": 0.25},
    # Noisy teacher forcing from 40 % of the steps on: at step 3,000, one wrong token above an object
    # token cut the target's top-1 there from 97 % to ~50 % (one to its left: ~43 %), so a miss in a
    # free-running sample was copied down the object (docs/notebook/session-2026-11-29-second-cycle.md).
    # Replacements from the scene itself (mostly background) taught it that an object goes on after
    # background (more stray pieces); any code (a wrong object piece) instead.
    input_noise=0.05,
    input_noise_from=0.4,
    input_noise_kind="codes",
    # The cells before the first object 25x: a blank canvas in 16-20 % of one-object samples came
    # from a start probability near the data's marginal, not its conditional (the hazard notebook).
    first_start_weight=25.0,
    # A quarter of the steps under ZipAR's view: with the row above fed, the trial's target scored
    # 0.371 under ZipAR's view (window 4) without ever training in it, 0.386 with half its steps
    # there, and learnt objects a little faster without (40.7 % against 38.2 % at 400 steps).
    zipar_share=0.25,
    proxy_weight=8.0,
)
# Measured alone on the 2 cores (docs/notebook/session-2026-11-29-sizing.md): a target step of 16
# scenes at width 128 takes 1.92 s with the background-sampled loss (2.06 s at 4,096 codes; 2.67 s
# with the loss on every position; width 192: 3.29 s; 96: 1.38 s); the profile: matrix products
# 41 %, attention over 1,040 slots 44 %, ~100 GFLOP/s, near the cores' floor.
RECIPES["scenes"] = Recipe(
    "scenes",
    px=128,
    svg=True,
    # k-means codebooks of pixel squares serving the three sizes keep the referee at 0.969 / 0.982 / 0.990
    # of 512 held-out scenes with 1,024 / 2,048 / 4,096 codes (benchmarks/scenes-vq-study.json): 2,048 is
    # the smallest that clears the bar, and a target step costs less with it (its output head) than
    # with 4,096; the study's candidates ran on it, so the full run does too.
    vq_codes=(2048,),
    budget=FULL_SCENES,
    smoke=replace(
        SMOKE,
        images=24,
        held_out_scenes=8,
        scene_chunk=8,
        oracle_images=2,
        zipar_share=0.5,
        proxy_weight=8.0,
        validate_every=2,
        ar_text_mix=FULL_SCENES.ar_text_mix,
        background_loss_share=0.1,
    ),
    # No top-p: an object's first token is one of ~169 places, each of small probability, so top-p
    # 0.8-0.95 cut every start (the neighbours notebook); no guidance: it multiplies those small
    # probabilities everywhere (88 stray pieces an image at 3; the rotary notebook). Calibrated
    # (48 prompts, seeds 0, 1000): r = 4 keeps AR's quality at no point, so the fastest point where
    # r = 2 does: l 0, k 4, tau 0.01 (10.7x NFE, FD 0.92x AR's; l 2: FD 1.45x; 2026-12-01 shipped notebook).
    defaults={**DEFAULTS, "cfg": 1.0, "top_p": 1.0, "rows_per_block": 16, "drafting": "zipar", "island_window": 8}
    | {"radius": 0, "k": 4, "tau": 0.01},
    target=SCENES_TARGET,
    draft_model=SCENES_DRAFT_MODEL,
    # The prompt's objects left to right, one a column (``SceneConfig.placement``): free places left a
    # target that drew more objects than named (off the background at 0.36 % a token once every object
    # had begun; 450 steps on columns: 0.13 %) (docs/notebook/session-2026-11-30-columns.md).
    scenes=SceneConfig(placement="columns"),
    # Each slot also reads its column's named object (``GPTConfig.column_objects``): held-out loss
    # 0.0230 against 0.0258, named objects found in AR 10/44 against 5/44 (the column-input notebook).
    scene_condition="clip_placed",
    # A codebook of 4 px pixel squares, not a VQModel: the best conv VQ trained here (tiled, spatial
    # decoder, 3,000 steps, 65 CPU-minutes) drew the objects at 17.5 dB and kept the referee at 0.59,
    # flattening, where k-means of the squares takes a minute (benchmarks/scenes-vq-study.json).
    # k-means sees 75 % squares not one flat colour. Up-samplers reading the whole block: 0.987 of object
    # cells right at 1,000 steps (row-causal 0.933; the old 128x3 0.58; the upsampler notebook).
    hyper=replace(Hyper(), vq_busy=0.75, upsampler_width=256, upsampler_depth=5, upsampler_context="block"),
    int8_models=("upsampler_r2", "upsampler_r4"),  # 8.5 + 10.1 MB -> 4.3 + 5.1; object cells 0.9988 either way
    vq_model={"kind": "patches"},
)

# The short study before the full run (issue 63): candidates that differ from ``scenes`` in one
# thing each, trained end to end at one budget of <= 30 CPU-minutes (``STUDY_SCENES``) with one
# codebook, and compared by AR's prompt match per CPU-minute and by how much of the drafters'
# layout the target accepts (``python -m mulo scenes-study``; docs in mulo/eval/probes/scenes_study.py).
# Sized by scenes-base's stage times at 600 target steps (docs/notebook/session-2026-11-29-sizing.md):
# clip 175 s (300 steps), VQ 74 s, tokens 204 s (9,600 scenes), target 1,392 s, drafters 127 + 37 s,
# draft model 60 s, up-samplers 1.1 + 0.7 s a step: 38 minutes. Cut to ~28: 6,400 training scenes.
STUDY_SCENES = replace(
    FULL_SCENES,
    images=1024,
    held_out_scenes=128,
    clip_steps=200,
    vq_steps=400,
    ar_steps=400,
    drafter_steps=250,
    draft_model_steps=100,
    upsampler_steps=100,
    eagle_steps=50,
    eval_prompts=24,
    validate_every=100,
    oracle_images=8,
)
STUDY_CANDIDATES = {
    "scenes-base": ("objects 32 px, free 8 px steps, 64 emoji, target 128x4", {}, {}),
    "scenes-s24": ("objects 24 px (6x6 tokens)", {"object_px": 24}, {}),
    "scenes-slots": ("a 3x3 slot grid instead of free 8 px steps", {"placement": "slots"}, {}),
    "scenes-v32": ("a vocabulary of 32 emoji, not 64", {"vocabulary": 32}, {}),
    "scenes-grid-pe": (
        "position embedding started as row + column sinusoids",
        {},
        {"hyper": replace(RECIPES["scenes"].hyper, pe_init="grid")},
    ),
    "scenes-t192": (
        "a target of width 192, not 128 (1.7x the step time)",
        {},
        {"target": dict(SCENES_TARGET, dim=192, n_head=3)},
    ),
}
for _name, (_, _scene, _models) in STUDY_CANDIDATES.items():
    _placed = replace(RECIPES["scenes"].scenes, **_scene)
    RECIPES[_name] = replace(
        RECIPES["scenes"],
        family=_name,
        vq_codes=(2048,),  # the smallest codebook that clears the referee's bar
        budget=STUDY_SCENES,
        scenes=_placed,  # placed symbols need columns: other placements read the mini-CLIP alone
        scene_condition=RECIPES["scenes"].scene_condition if _placed.placement == "columns" else "clip",
        **_models,
    )
