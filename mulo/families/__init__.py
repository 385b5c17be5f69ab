"""Model families by name."""

from __future__ import annotations

FAMILIES = ("twemoji", "toy", "tar")
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
    if name == "twemoji":
        from mulo.families import twemoji

        return twemoji.build().to(device)
    if name == "tar" or name.startswith("tar-"):
        from mulo.families import tar

        return tar.build(name, device)
    raise ValueError(f"family must be one of {', '.join(FAMILIES + TAR_VARIANTS[1:])} (got {name!r})")
