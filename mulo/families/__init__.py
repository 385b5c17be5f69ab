"""Model families by name."""

from __future__ import annotations

from pathlib import Path

# The families this project trains (``python -m mulo train NAME``), each shipped in assets/NAME once
# trained: ``twemoji``, 32x32 tokens at 128 px (Tar's 512 px geometry, issue 19); ``twemoji-64``,
# the first one, 16x16 tokens at 64 px; ``emoji``, 32x32 tokens over five emoji styles (issue 38).
TRAINED = ("twemoji", "twemoji-64", "emoji")
ASSETS_ROOT = Path(__file__).resolve().parents[2] / "assets"
FAMILIES = (*TRAINED, "toy", "tar")
# The app's and the CLI's family: the 32x32 one, at the geometry of Tar's 512 px setting (issue 19).
DEFAULT_FAMILY = "twemoji"
TAR_VARIANTS = ("tar", "tar-1.5b-1024", "tar-7b-512", "tar-7b-1024")


def check_available(name: str) -> None:
    """Fail fast, before torch is imported, when a family's weights are not on this machine."""
    if name == "tar" or name.startswith("tar-"):
        from mulo.families import tar

        tar.locate(tar.parse_variant(name))


def load_family(name: str, device: str = "cpu"):
    """Load a family onto ``device``; raises ValueError (unknown name) or FileNotFoundError
    (weights missing; for ``tar`` the message lists the files and the download command)."""
    if name == "toy":
        from mulo.families import toy

        return toy.build().to(device)
    if name in TRAINED:
        from mulo.families import twemoji

        return twemoji.build(name).to(device)
    if name == "tar" or name.startswith("tar-"):
        from mulo.families import tar

        return tar.build(name, device)
    raise ValueError(f"family must be one of {', '.join(FAMILIES + TAR_VARIANTS[1:])} (got {name!r})")
