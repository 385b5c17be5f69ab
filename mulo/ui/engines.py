"""The app's shared engines: one per family, loaded on first use and kept for every request."""

from __future__ import annotations

import json
import os
import threading

import gradio as gr

from mulo import families
from mulo.engine import Engine
from mulo.families import ASSETS_ROOT, DEFAULT_FAMILY, load_family
from mulo.ui.torch_thread import TORCH


def family_choices() -> tuple[str, ...]:
    """Every registered family but a trained one whose weights are not in assets/ (Tar's are
    downloaded on demand)."""
    return tuple(name for name, spec in families.REGISTRY.items() if spec.shipped())


def runnable(name: str) -> bool:
    """Whether ``name``'s weights are on this machine (Tar's: in the Hugging Face cache; checked
    without going online)."""
    try:
        families.check_available(name)
    except (ValueError, FileNotFoundError):
        return False
    return True


def menu_families() -> tuple[str, ...]:
    """The family menu: only what runs here (a request may still name another and be told how
    to get it)."""
    return tuple(name for name in family_choices() if runnable(name))


def family_info() -> str:
    """The family menu's help: what each listed family is, and one line on the ones that need
    weights this machine lacks (Tar's)."""
    listed = menu_families()
    missing = [name for name in family_choices() if name not in listed]
    info = families.described(listed)
    if missing:
        info += (
            f"; not listed, their weights are not on this machine: {', '.join(missing)} "
            "(Tar: `python -m mulo download tar [--llm 7b] [--res 1024]`, then restart the app; it needs a GPU)"
        )
    return info


DEFAULT_FAMILY = os.environ.get("MULO_FAMILY", DEFAULT_FAMILY)

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


PROMPT_INFO = "words the family knows; unknown words are reported"


def _asset_json(family: str, name: str):
    """A trained family's ``assets/FAMILY/NAME`` parsed, read without loading the family; None for
    other families, a missing file or a broken one (a hint never breaks the app)."""
    if family not in families.trained():
        return None
    try:
        return json.loads((ASSETS_ROOT / family / name).read_text())
    except (OSError, ValueError):
        return None


def styles_of(family: str) -> list[dict]:
    """The drawing styles a trained family's prompts may name (its ``styles.json``: word, title,
    licence); [] for families with one style."""
    return _asset_json(family, "styles.json") or []


def scene_language(family: str) -> dict | None:
    """A scenes family's prompt language (its ``scenes.json``: names, palette, max_objects,
    styles); None for other families or a malformed file."""
    language = _asset_json(family, "scenes.json")
    well_formed = isinstance(language, dict) and isinstance(language.get("palette"), dict)
    return language if well_formed and isinstance(language.get("max_objects"), int) else None


def prompt_info(family: str) -> str:
    """The prompt box's hint: a scenes family's grammar, else the style words when the family
    has several styles."""
    scene = scene_language(family)
    if scene is not None:
        styles = ", ".join(map(str, scene.get("styles") or ()))
        styled = f"; optionally 'in noto style' ({styles})" if styles else ""
        backgrounds = ", ".join(scene["palette"])
        example = "e.g. 'red apple and rocket on blue'"
        return f"1 to {scene['max_objects']} emoji and a background, {example}; backgrounds: {backgrounds}{styled}"
    styles = styles_of(family)
    if not styles:
        return PROMPT_INFO
    words = ", ".join(f"{s['word']} ({s['title']})" for s in styles)
    return f"{PROMPT_INFO}; end with a style word to pick one (else any style): {words}"


def engine_for(family: str) -> Engine:
    """The shared engine of ``family`` (loaded once, on the app's torch thread; a load failure is
    a gr.Error)."""
    engine = _engines.get(family)
    return engine if engine is not None else TORCH.call(_load, family)


def _load(family: str) -> Engine:
    with _engines_lock:
        if family not in _engines:
            try:
                # Compiles in the background: a visitor never waits on a compiler (mulo.compiled)
                _engines[family] = Engine(load_family(family, "cuda" if _cuda() else "cpu"), background_compile=True)
            except (ValueError, FileNotFoundError) as exc:
                raise gr.Error(str(exc)) from None
        return _engines[family]


def loaded(family) -> Engine | None:
    """The engine of ``family`` if it is loaded already. Never loads one, nor waits for one
    being loaded (no lock: a replay is not held up by a family loading for a generation)."""
    return _engines.get(family) if isinstance(family, str) else None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
