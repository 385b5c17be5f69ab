"""The files the app sends: pictures and exports in a swept temp folder, and the bundled traces."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from mulo.ui import viz
from mulo.ui.tempfiles import TempFiles

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "assets" / "examples"
OUT_DIR = Path(tempfile.gettempdir()) / "mulo-app"
FILES = TempFiles(OUT_DIR, max_age_s=float(os.environ.get("MULO_FILE_MAX_AGE_S", "600")))
DISPLAY = 256  # on-screen size of the generated images (nearest-neighbour, token cells stay sharp)


def save_png(image: np.ndarray, stem: str) -> str:
    return FILES.png(image, stem)


def save_bytes(data: bytes, name: str) -> str:
    return FILES.write(data, name)


def shown(image: np.ndarray) -> np.ndarray:
    return viz.enlarge(image, DISPLAY)


def example_traces() -> list[str]:
    return sorted(p.name for p in EXAMPLES_DIR.glob("*.json")) if EXAMPLES_DIR.exists() else []
