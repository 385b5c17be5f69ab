"""Model families by name."""

from __future__ import annotations

FAMILIES = ("twemoji", "toy")


def load_family(name: str, device: str = "cpu"):
    """Load a family onto ``device``; raises ValueError (unknown name) or FileNotFoundError."""
    if name == "toy":
        from mulo.families import toy

        return toy.build().to(device)
    if name == "twemoji":
        from mulo.families import twemoji

        return twemoji.build().to(device)
    raise ValueError(f"family must be one of {', '.join(FAMILIES)} (got {name!r})")
