"""``gpu``: ``spaces.GPU`` on a ZeroGPU Space, a no-op decorator everywhere else.

On ZeroGPU the decorated function runs in a forked worker holding a GPU; its arguments and
yields must pickle (the app yields numpy images and traces, never tensors or engines).
"""

from __future__ import annotations

try:  # present on Hugging Face Spaces; itself a no-op when SPACES_ZERO_GPU is not set
    import spaces

    gpu = spaces.GPU
except ImportError:

    def gpu(fn=None, **_options):
        return fn if fn is not None else (lambda f: f)
