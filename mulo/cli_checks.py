"""Checks of command-line devices and output paths, run before any model loads.

A bad ``--out`` or ``--device`` should cost a second, not a generation, a benchmark or a training
run that ends in a traceback. Each check raises ``UsageError`` with one line naming the flag;
``mulo.__main__.main`` prints it as ``error: ...`` and exits with status 2.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

# Shown when an --out extension is refused: the common ones, not all of PIL's forty-odd.
COMMON_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


class UsageError(ValueError):
    """Bad command-line input; a ValueError so main() reports it like every other bad knob."""


def check_device(device: str, flag: str = "--device") -> None:
    """``device`` parses as cpu, cuda, cuda:N or mps, and that device exists on this machine."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:  # torch's own message lists twenty device types we do not support
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"{flag} must be cpu, cuda, cuda:N or mps (got {device!r})")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"{flag} {device}: no CUDA device is available on this machine (use --device cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise UsageError(f"{flag} {device}: only {count} CUDA device(s) here, cuda:0 to cuda:{count - 1}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"{flag} {device}: no MPS device is available on this machine (use --device cpu)")


def check_output_file(flag: str, path: Path, suffixes: frozenset[str] | None = None) -> None:
    """``path`` can be written as a file: not a folder, its folder exists or can be made, and
    (given ``suffixes``) its extension is one of them. Creates the missing parent folders."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory, not a file")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        shown = ", ".join(s for s in COMMON_IMAGE_SUFFIXES if s in suffixes)
        got = f"extension {path.suffix!r}" if path.suffix else "no extension"
        raise UsageError(f"{flag} {path} has {got}; use {shown} or another image format PIL can write")
    _check_creatable(flag, path, path.parent)


def check_output_dir(flag: str, path: Path) -> None:
    """``path`` is, or can be made, a writable folder. Creates it (and its parents)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    _check_creatable(flag, path, path)


def _check_creatable(flag: str, path: Path, folder: Path) -> None:
    """``folder`` (``path`` itself or its parent) exists or can be made, and ``path`` can be written."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())  # "/" or "." at worst
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file, not a directory")
    target = path if path.exists() else existing  # overwrite the file, or create inside the folder
    if not _writable(target):
        raise UsageError(f"{flag} {path}: {target} is not writable")
    # os.access cannot see everything (root on /proc, read-only mounts, quotas): making the
    # folders now, as the command would later anyway, is the check that cannot be fooled.
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create {folder} ({exc.strerror or exc})") from None


def _writable(path: Path) -> bool:
    # A folder needs search permission (X) as well to create anything inside it.
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


@functools.cache
def image_suffixes() -> frozenset[str]:
    """Extensions PIL can write an RGB image as; tried for real (about 0.1 s), since some of
    PIL's registered savers are stubs (.h5, .wmf) or refuse RGB (.msp, .xbm)."""
    import io

    from PIL import Image

    probe = Image.new("RGB", (8, 8))
    ok = set()
    for suffix, fmt in Image.registered_extensions().items():
        if fmt not in Image.SAVE:
            continue
        try:
            probe.save(io.BytesIO(), format=fmt)
        except Exception:  # noqa: BLE001 - any failure means "cannot write", whatever the plugin raises
            continue
        ok.add(suffix)
    return frozenset(ok)
