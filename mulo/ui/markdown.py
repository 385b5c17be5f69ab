"""Text from outside (a trace file's prompt, warnings, labels) shown inside our Markdown.

Trace files are shared, so their strings are data: ``plain`` makes a string render as exactly
its characters, never as a link, an image, HTML or a heading.
"""

from __future__ import annotations

import string

_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}
# Every other ASCII punctuation mark gets a backslash, which CommonMark reads as the literal mark.
_ESCAPED = {c: "\\" + c for c in string.punctuation if c not in _ENTITIES}


def plain(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters, every Markdown and HTML character
    escaped."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return "".join(_ENTITIES.get(c) or _ESCAPED.get(c) or c for c in text)
