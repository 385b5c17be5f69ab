"""The family registry: every model family declared once, by name.

A family is one ``register`` call: its name, a one-line summary, the module that builds it and
whether we train it. The CLI's ``--family`` help and ``train`` choices, the app's family menu and
``load_family`` all read this table, so adding a family edits no name list (see
``tests/test_registry.py``). A family's module is imported only when it is loaded or checked: the
CLI answers ``--help`` and a missing-weights error before torch is imported.

A family module provides ``load(name, device) -> Family`` and may provide ``check_available(name)``
(standard library only) that raises ``FileNotFoundError`` when the weights are not on this machine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

ASSETS_ROOT = Path(__file__).resolve().parents[2] / "assets"


@dataclass(frozen=True)
class FamilySpec:
    name: str
    summary: str
    module: str  # imported on first use; its ``load(name, device)`` builds the family
    # trained here (``python -m mulo train NAME``) and shipped in assets/NAME; a recipe whose models
    # are not trained yet (mulo/train/recipes.py) is registered once they are
    trained: bool = False
    # the app's example prompts for this family (``examples``: a generic list when empty)
    examples: tuple[str, ...] = ()

    def shipped(self) -> bool:
        """Whether the weights are on this machine without a download (a trained family: in assets/;
        other families build or download theirs, so they count as present)."""
        return not self.trained or (ASSETS_ROOT / self.name / "target.safetensors").exists()

    def check_available(self) -> None:
        check = getattr(importlib.import_module(self.module), "check_available", None)
        if check is not None:
            check(self.name)

    def load(self, device: str = "cpu"):
        return importlib.import_module(self.module).load(self.name, device)


REGISTRY: dict[str, FamilySpec] = {}
ALIASES: dict[str, str] = {}  # another name -> the registered one (not listed in menus)


def register(name: str, summary: str, module: str, *, trained: bool = False, examples=()) -> FamilySpec:
    if name in REGISTRY:
        raise ValueError(f"family {name!r} is already registered")
    REGISTRY[name] = spec = FamilySpec(name, summary, module, trained, tuple(examples))
    return spec


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def get(name: str) -> FamilySpec:
    try:
        return REGISTRY[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"family must be one of {', '.join(REGISTRY)} (got {name!r})") from None


# Prompts every emoji-trained family and Tar draw: the examples of a family that names none
GENERIC_EXAMPLES = ("red apple", "cat face", "rocket", "grinning face", "pizza", "ghost", "sun", "crown")


def examples(name: str) -> tuple[str, ...]:
    """The app's example prompts for family ``name``."""
    return get(name).examples or GENERIC_EXAMPLES


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def trained() -> tuple[str, ...]:
    return tuple(name for name, spec in REGISTRY.items() if spec.trained)


def described(names) -> str:
    """``name: summary`` of each family, one line (the CLI's help and the app's family menu)."""
    return "; ".join(f"{name}: {get(name).summary}" for name in names)


def check_available(name: str) -> None:
    """Fail fast, before torch is imported, on an unknown name (ValueError) or weights that are not on
    this machine (FileNotFoundError, naming the command that fetches them)."""
    get(name).check_available()


DTYPES = ("auto", "float32", "bfloat16")


def resolve_dtype(dtype: str, device: str):
    """The torch dtype ``dtype`` names: ``auto`` is bfloat16 on CUDA (a step there is memory-bound)
    and float32 elsewhere (a CPU's single-token bf16 products are slower than its fp32 ones; its
    wide passes may run in bf16 where measured faster, ``mulo.wide``)."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def load_family(name: str, device: str = "cpu", dtype: str = "auto"):
    """Load a family onto ``device``; raises ValueError (unknown name) or FileNotFoundError
    (weights missing; for ``tar`` the message lists the files and the download command). Our
    families' AR models go to ``dtype`` (``resolve_dtype``); ``tar`` picks its own unless one is named."""
    spec = get(name)
    family = spec.load(device)
    if spec.module != "mulo.families.tar" or dtype != "auto":
        family.to(device, resolve_dtype(dtype, device))
    return family


# The app's and the CLI's family: the 32x32 one, at the geometry of Tar's 512 px setting (issue 19).
DEFAULT_FAMILY = "twemoji"

register(
    "twemoji", "trained by us, 32x32 tokens at 128 px (Tar's 512 px geometry), on a CPU", "mulo.families.emoji",
    trained=True,
)  # fmt: skip
register("twemoji-64", "trained by us, 16x16 tokens at 64 px, on a CPU", "mulo.families.emoji", trained=True)
register(
    "scenes", "trained by us on a CPU, 32x32 tokens at 128 px: 1-3 small emoji on a named background (issue 63)",
    "mulo.families.emoji", trained=True,
    examples=("red apple on blue", "rocket and sun on purple", "cat, pizza and star on green"),
)  # fmt: skip
# Archived (docs/emoji-16/): trained by its recipe, no longer shipped (the scenes family took its place).
register(
    "emoji-16", "trained by us on a CPU, 16x16 tokens at 64 px in five emoji styles (issue 46)",
    "mulo.families.emoji", trained=True,
)  # fmt: skip
register("toy", "random weights, 8x8 tokens (code paths only)", "mulo.families.toy")
# Tar's weights come from the Hub (``python -m mulo download tar``); loading never goes online.
register("tar", "the real Tar-1.5B at 512 px (GPU; weights from `python -m mulo download tar`)", "mulo.families.tar")
ALIASES["tar-1.5b-512"] = "tar"  # the variant's full name, as docs/tar.md gives it
register("tar-1.5b-1024", "Tar-1.5B at 1024 px", "mulo.families.tar")
register("tar-7b-512", "Tar-7B at 512 px", "mulo.families.tar")
register("tar-7b-1024", "Tar-7B at 1024 px", "mulo.families.tar")
