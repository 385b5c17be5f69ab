"""mulo: MuLo-SD (multi-scale local speculative decoding) and its baselines for AR image models."""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
