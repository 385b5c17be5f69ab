"""The twemoji families, trained by ``python -m mulo train NAME`` and shipped in assets/NAME.

Each has a target AR model, equal-size drafters on the half (r=2) and quarter (r=4) grid, a small
same-grid draft model for SD (and LANTERN-chain), learned up-samplers for r=2 and r=4, an EAGLE draft head,
a diffusers VQModel shared by every resolution and the mini-CLIP text encoder as conditioner.
``twemoji``: 32x32 target tokens (128 px); ``twemoji-64``: 16x16 (64 px), the first family.
Weights are fp16 safetensors, loaded as float32; nothing is downloaded.

A scenes family (issue 63; its folder holds ``scenes.json``, its language, and
``referee_sprites.npz``, its referee) reads prompts through the scenes grammar (``mulo.scenes``):
a prompt it cannot draw is an error naming the problem, and the models are conditioned on the
prompt as the grammar writes it: its mini-CLIP features, or (``scenes.json``'s ``"condition":
"symbols"`` or ``"placed"``) its background, names and styles as one-hot slots (``scene_symbols``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from mulo import families
from mulo import scenes as scene_language
from mulo.families import ASSETS_ROOT, int8
from mulo.families.base import Evaluation, Family
from mulo.models.eagle import EagleHead
from mulo.models.gpt import GPT, GPTConfig, placed_slot, placed_slots
from mulo.models.text import MiniCLIP, words
from mulo.models.upsample import TokenUpsampler
from mulo.models.vq import VQTokenizer, build_model, make_tokenizer

FILES = ("clip", "vq", "target", "drafter_r2", "drafter_r4", "draft_model", "upsampler_r2", "upsampler_r4")


def load_weights(folder: Path, name: str) -> tuple[dict, dict]:
    """The JSON config and the float32 state dict of one exported model (``name``.json/.safetensors;
    float16, or int8 with row scales: ``mulo.families.int8``)."""
    config = json.loads((folder / f"{name}.json").read_text())
    return config, int8.dequantize(load_file(folder / f"{name}.safetensors"))


def _gpt(folder: Path, name: str) -> GPT:
    config, state = load_weights(folder, name)
    model = GPT(GPTConfig.from_json(config))
    model.load_state_dict(state)
    return model


def load_vq(folder: Path) -> VQTokenizer:
    """The tokenizer of ``vq.json`` / ``vq.safetensors`` in ``folder`` (the family's, or a run's
    export): the ``VQModel`` arguments, and ``tile`` when the VQ reads images as tiles; or a
    codebook of pixel squares (``mulo.models.patch_vq``)."""
    config, state = load_weights(folder, "vq")
    model = build_model(config)
    model.load_state_dict(state)
    return make_tokenizer(model.eval(), config.get("tile", 0))


class PromptConditioner:
    """Prompt -> mini-CLIP per-word features.

    ``aliases`` maps emoji short names to emoji names ("pizza" -> "slice of pizza", from
    emoji.json): the AR models learnt names, and a short name alone is what people type."""

    def __init__(self, clip: MiniCLIP, aliases: dict[str, str] | None = None):
        self.clip = clip
        self.aliases = dict(aliases or {})

    def alias(self, prompt: str) -> str | None:
        """The emoji name ``prompt`` is a short name of, or None."""
        return self.aliases.get(" ".join(words(prompt)))

    def check(self, prompt: str) -> None:
        self.clip.check_prompt(prompt)

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        return self.clip.condition(prompt)[0]  # deterministic: the seed does not matter

    def ignored(self, prompt: str) -> list[str]:
        """What of ``prompt`` the condition leaves out, one sentence each (the trace's warnings)."""
        tokenizer = self.clip.tokenizer
        known, unknown = tokenizer.split(prompt)
        notes = [f"unknown words ignored: {', '.join(unknown)}"] if unknown else []
        # accents, emoji, other scripts: the tokenizer reads a-z and digits (ASCII punctuation separates words)
        dropped = sorted({c for c in prompt if not c.isascii() and not c.isspace()})
        if dropped:
            notes.append(f"characters ignored: {' '.join(dropped)}")
        if len(known) > tokenizer.max_len:
            notes.append(
                f"only the first {tokenizer.max_len} known words are used "
                f"(dropped: {' '.join(known[tokenizer.max_len :])})"
            )
        return notes


class ScenePromptConditioner(PromptConditioner):
    """A scenes family's prompts: read by its grammar (``mulo.scenes.parse_prompt`` with its
    vocabulary, palette and object count: unknown emoji with the nearest names, too many objects,
    an unknown colour are errors), then conditioned as the grammar writes them ("A red apple &
    rocket on BLUE" -> "red apple and rocket on blue", the text the models were trained on)."""

    def __init__(self, clip: MiniCLIP, language: dict):
        super().__init__(clip)
        self.names, self.palette = tuple(language["names"]), dict(language["palette"])
        self.max_objects = int(language["max_objects"])

    def canonical(self, prompt: str) -> str:
        return scene_language.parse_prompt(prompt, self.max_objects, self.names, self.palette).text()

    def check(self, prompt: str) -> None:
        self.clip.check_prompt(self.canonical(prompt))

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        return self.clip.condition(self.canonical(prompt))[0]

    def ignored(self, prompt: str) -> list[str]:
        return super().ignored(self.canonical(prompt))


def scene_symbols(texts, language: dict, cond_len: int, width: int) -> torch.Tensor:
    """``[len(texts), cond_len, width]``: each prompt or description of a scenes family as its
    symbols (``mulo.scenes.symbol_slots``): slot k one-hot over the table of names, colours and
    styles, at the norm of the mini-CLIP's conditions (sqrt(width)); unused slots stay zero, like
    the null condition's. ``language["condition"] == "placed"``: the k-th of n objects goes to slot
    ``placed_slot(n, k)``, whose key a ``condition_columns`` model turns by that object's column."""
    names, palette, styles = language["names"], language["palette"], language["styles"]
    if len(names) + len(palette) + len(styles) > width:
        raise ValueError(f"{len(names) + len(palette) + len(styles)} symbols do not fit conditions {width} wide")
    if 1 + int(language["max_objects"]) > cond_len:
        raise ValueError(f"{language['max_objects']} objects and a background do not fit {cond_len} condition slots")
    placed = language.get("condition") == "placed"
    if placed and placed_slots(int(language["max_objects"])) > cond_len:
        raise ValueError(f"{language['max_objects']} objects by count and place do not fit {cond_len} condition slots")
    features = torch.zeros(len(texts), cond_len, width)
    for i, text in enumerate(texts):
        background, *objects = scene_language.symbol_slots(text, int(language["max_objects"]), names, palette, styles)
        slots = {0: background}
        for k, indices in enumerate(objects):  # placed: the k-th of n at its count's place
            slots[placed_slot(len(objects), k) if placed else 1 + k] = indices
        for slot, indices in slots.items():
            if indices:
                features[i, slot, list(indices)] = (width / len(indices)) ** 0.5
    return features


def column_symbols(texts, language: dict, cond_len: int) -> torch.Tensor:
    """``[len(texts), cond_len, S]``: the placed symbols (``scene_symbols``) one-hot over exactly the
    S names, colours and styles of ``language``: the channels a ``GPTConfig.column_objects`` model
    reads after its mini-CLIP features."""
    width = len(language["names"]) + len(language["palette"]) + len(language["styles"])
    return scene_symbols(texts, {**language, "condition": "placed"}, cond_len, width)


class SceneColumnConditioner(ScenePromptConditioner):
    """A scenes family whose models read the prompt's mini-CLIP features and its placed symbols
    (``column_symbols``), the latter added at every slot by its column (``GPTConfig.column_objects``)."""

    def __init__(self, clip: MiniCLIP, language: dict):
        super().__init__(clip, language)
        self.language = dict(language)

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        features = super().__call__(prompt, seed)
        symbols = column_symbols([self.canonical(prompt)], self.language, features.shape[0])[0]
        return torch.cat([features, symbols.to(features)], dim=-1)


class SceneSymbolConditioner(ScenePromptConditioner):
    """A scenes family whose models read the prompt's symbols (``scene_symbols``), not its words'
    mini-CLIP features: which emoji, colour and style, exactly."""

    def __init__(self, clip: MiniCLIP, language: dict, cond_len: int):
        super().__init__(clip, language)
        self.language, self.cond_len = dict(language), cond_len

    def __call__(self, prompt: str, seed: int = 0) -> torch.Tensor:
        return scene_symbols([self.canonical(prompt)], self.language, self.cond_len, self.clip.cond_dim)[0]


def scene_conditioner(clip: MiniCLIP, language: dict, cond_len: int) -> ScenePromptConditioner:
    """The conditioner ``language`` (a scenes family's ``scenes.json``) asks for."""
    if language.get("condition", "clip") in ("symbols", "placed"):
        return SceneSymbolConditioner(clip, language, cond_len)
    if language.get("condition") == "clip_placed":
        return SceneColumnConditioner(clip, language)
    return ScenePromptConditioner(clip, language)


def load(name: str, device: str = "cpu") -> Family:
    """The registry's entry point (``mulo.families``): the shipped family ``name`` on ``device``."""
    return build(name).to(device)


def build(name: str, folder: str | Path | None = None) -> Family:
    """The family ``name`` from ``folder`` (default: assets/NAME, where ``name`` must be a registered
    trained family; a training run names its own folder and may build a recipe not registered yet)."""
    if folder is None and name not in families.trained():
        raise ValueError(f"a trained family must be one of {', '.join(families.trained())} (got {name!r})")
    folder = Path(folder) if folder is not None else ASSETS_ROOT / name
    missing = [f"{n}.{ext}" for n in FILES for ext in ("json", "safetensors") if not (folder / f"{n}.{ext}").exists()]
    if missing:
        shipped = [n for n in families.trained() if n != name and families.get(n).shipped()]
        raise FileNotFoundError(
            f"{name} weights missing in {folder} ({', '.join(missing[:3])}...): "
            f"train them with python -m mulo train {name}, or use --family {' or '.join([*shipped, 'toy'])}"
        )
    config, state = load_weights(folder, "clip")
    clip = MiniCLIP(config["vocab"], max_len=config["max_len"])
    clip.load_state_dict(state)
    vq = load_vq(folder)
    upsamplers = {}
    for r in (2, 4):
        config, state = load_weights(folder, f"upsampler_r{r}")
        upsamplers[r] = TokenUpsampler(**config)
        upsamplers[r].load_state_dict(state)
    defaults = json.loads((folder / "defaults.json").read_text()) if (folder / "defaults.json").exists() else {}
    aliases = json.loads((folder / "aliases.json").read_text()) if (folder / "aliases.json").exists() else {}
    styles = json.loads((folder / "styles.json").read_text()) if (folder / "styles.json").exists() else []
    language = json.loads((folder / "scenes.json").read_text()) if (folder / "scenes.json").exists() else None
    target = _gpt(folder, "target")
    if language is not None:
        conditioner = scene_conditioner(clip.eval(), language, target.config.cond_len)
        referee = folder / "referee_sprites.npz"
    else:
        conditioner, referee = PromptConditioner(clip.eval(), aliases), None
    head = None
    if (folder / "eagle_head.safetensors").exists():  # EAGLE-2's head, trained on this target
        head = EagleHead(target.config)
        head.load_state_dict(load_weights(folder, "eagle_head")[1])
    return Family(
        name,
        target,
        {2: _gpt(folder, "drafter_r2"), 4: _gpt(folder, "drafter_r4")},
        vq,
        conditioner,
        draft_model=_gpt(folder, "draft_model"),
        upsamplers=upsamplers,
        defaults=defaults,
        evaluation=Evaluation(folder, clip, referee),  # the metrics' files live beside the weights
        eagle_head=head,
        no_eagle_head=f"{folder} has no eagle_head.safetensors (train one: python -m mulo train {name} "
        f"--adopt {folder} --stages data,clip,vq,tokens,target,eagle,export)",
        styles=tuple(language["styles"]) if language else tuple(s["word"] for s in styles),
    )
