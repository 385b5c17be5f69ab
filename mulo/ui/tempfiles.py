"""Files the app hands to the browser (round pictures, exports, trace downloads), kept bounded.

Every request writes a handful of files; gradio copies each into its own cache as it sends it,
so ours are only needed for moments. ``TempFiles`` deletes those older than ``max_age_s``
whenever it writes and at least ``every_s`` has passed since it last looked, so the folder of a
long-running app holds about ``max_age_s`` worth of traffic. (Gradio's cache is cleaned by
``gr.Blocks(delete_cache=...)``.)
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from PIL import Image


class TempFiles:
    def __init__(self, root: Path, max_age_s: float = 600.0, every_s: float = 60.0):
        self.root, self.max_age_s, self.every_s = Path(root), max_age_s, every_s
        self._last_sweep = 0.0
        self._lock = threading.Lock()

    def png(self, image: np.ndarray, stem: str) -> str:
        path = self._folder() / f"{stem}.png"
        Image.fromarray(image).save(path)
        return str(path)

    def write(self, data: bytes, name: str) -> str:
        path = self._folder() / name
        path.write_bytes(data)
        return str(path)

    def _folder(self) -> Path:
        """A fresh folder per file: names stay readable for downloads and never collide."""
        self.maybe_sweep()
        folder = self.root / uuid.uuid4().hex[:12]
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def maybe_sweep(self) -> None:
        now = time.time()
        with self._lock:
            if now - self._last_sweep < self.every_s:
                return
            self._last_sweep = now
        self.sweep(now)

    def sweep(self, now: float | None = None) -> int:
        """Delete the folders older than ``max_age_s``; returns how many went."""
        now = time.time() if now is None else now
        removed = 0
        for folder in self.root.glob("*") if self.root.exists() else ():
            try:
                if now - folder.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
                    removed += 1
            except FileNotFoundError:  # another thread swept it first
                continue
        return removed
