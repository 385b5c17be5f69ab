"""What the scripts that drive the app in a browser share: Debian's Chromium, never a downloaded one."""

from __future__ import annotations

import os
import shutil
import sys


def chromium_or_none() -> str | None:
    """Chromium's path (``CHROMIUM_PATH`` or the one on PATH); None, with a one-line error on
    stderr, when there is none."""
    chromium = os.environ.get("CHROMIUM_PATH", shutil.which("chromium") or "/usr/bin/chromium")
    if not os.path.exists(chromium):
        print(f"error: no Chromium at {chromium} (apt-get install -y chromium)", file=sys.stderr)
        return None
    return chromium
