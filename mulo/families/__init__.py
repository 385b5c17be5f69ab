"""Model families by name."""

from __future__ import annotations

FAMILIES = ("toy",)


def load_family(name: str, device: str = "cpu"):
    if name == "toy":
        from mulo.families import toy

        return toy.build().to(device)
    raise ValueError(f"family must be one of {', '.join(FAMILIES)} (got {name!r})")
