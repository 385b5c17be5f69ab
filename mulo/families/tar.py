"""The ``tar`` family: Tar's real checkpoints, read by our loaders (GPU; fp32 on CPU).

prompt -> Tar LLM (Qwen2, transformers) -> 729 TA-Tok codes -> TA-Tok decoder -> 729 x 1152
features -> AR-DTok: 256 px drafter (16x16 tokens) and 512 px (32x32, r = 2) or 1024 px
(64x64, r = 4) target, CFG 4 with all-zero null features -> LlamaGen VQ-16 -> image.

Family names: ``tar`` (= ``tar-1.5b-512``), ``tar-1.5b-1024``, ``tar-7b-512``, ``tar-7b-1024``.
Weights live in the standard Hugging Face cache; ``python -m mulo download tar`` fetches them.
Loading never touches the network: missing files raise ``MissingWeights`` naming each file and
the command that fetches them (so every entry point fails fast and offline).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Only the standard library at import time: ``locate`` must answer in well under a second so a
# missing-weights error comes before torch, diffusers and transformers are even imported.

LLM_REPOS = {"1.5b": "csuhan/Tar-1.5B", "7b": "csuhan/Tar-7B-v0.1"}
TA_TOK_REPO = "csuhan/TA-Tok"
VQ_REPO, VQ_FILE = "peizesun/llamagen_t2i", "vq_ds16_t2i.pt"
# What the Tar LLM repositories hold that inference reads (configs, tokenizer, safetensors shards).
LLM_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer*", "merges.txt", "vocab.json"]
DRAFTER_RES = 256
RATIOS = {512: 2, 1024: 4}
DEFAULTS = {"cfg": 4.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "tau": 0.1, "k": 8, "radius": 1}


class MissingWeights(FileNotFoundError):
    """Tar weights absent from the local cache (the message lists them and the fix)."""


@dataclass(frozen=True)
class Variant:
    llm: str = "1.5b"
    res: int = 512

    @property
    def name(self) -> str:
        return "tar" if (self.llm, self.res) == ("1.5b", 512) else f"tar-{self.llm}-{self.res}"

    @property
    def ratio(self) -> int:
        return RATIOS[self.res]

    def files(self) -> list[tuple[str, str | None]]:
        """(repository, file) pairs; file None = the repository's inference files (the LLM)."""
        return [
            (LLM_REPOS[self.llm], None),
            (TA_TOK_REPO, "ta_tok.pth"),
            (TA_TOK_REPO, f"ar_dtok_lp_{DRAFTER_RES}px.pth"),
            (TA_TOK_REPO, f"ar_dtok_lp_{self.res}px.pth"),
            (VQ_REPO, VQ_FILE),
        ]

    def download_command(self) -> str:
        return f"python -m mulo download tar --llm {self.llm} --res {self.res}"


def parse_variant(name: str) -> Variant:
    """``tar`` | ``tar-<1.5b|7b>-<512|1024>`` (either part may be left out)."""
    parts = name.lower().split("-")
    if parts[0] != "tar":
        raise ValueError(f"not a tar family name: {name!r}")
    llm, res = "1.5b", 512
    for part in parts[1:]:
        if part in LLM_REPOS:
            llm = part
        elif part.isdigit() and int(part) in RATIOS:
            res = int(part)
        else:
            choices = f"tar-<{'|'.join(LLM_REPOS)}>-<{'|'.join(map(str, RATIOS))}>"
            raise ValueError(f"unknown tar variant {part!r} in {name!r}: use {choices}")
    return Variant(llm, res)


@dataclass(frozen=True)
class Paths:
    """Local files of one variant (from the HF cache, or written by tests)."""

    llm: Path  # a folder: config, tokenizer, safetensors
    ta_tok: Path
    drafter: Path
    target: Path
    vq: Path


def locate(variant: Variant) -> Paths:
    """The cached files of ``variant``; raises MissingWeights without any network access."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    found, missing = {}, []
    for repo, filename in variant.files():
        if filename is None:
            try:
                found[repo] = Path(snapshot_download(repo, allow_patterns=LLM_PATTERNS, local_files_only=True))
            except Exception:  # noqa: BLE001 - any cache miss (no snapshot, partial snapshot)
                missing.append(f"{repo} (LLM repository)")
            continue
        path = try_to_load_from_cache(repo, filename)
        if isinstance(path, str) and Path(path).exists():
            found[(repo, filename)] = Path(path)
        else:
            missing.append(f"{repo}/{filename}")
    if missing:
        raise MissingWeights(
            f"{variant.name} weights are not in the Hugging Face cache ({_cache_dir()}): missing "
            f"{', '.join(missing)}; fetch them with: {variant.download_command()}"
        )
    files = variant.files()
    return Paths(
        llm=found[files[0][0]],
        ta_tok=found[files[1]],
        drafter=found[files[2]],
        target=found[files[3]],
        vq=found[files[4]],
    )


def download(variant: Variant) -> Paths:
    """Fetch every file of ``variant`` into the standard HF cache (resumable); returns the paths."""
    from huggingface_hub import hf_hub_download, snapshot_download

    for repo, filename in variant.files():
        if filename is None:
            snapshot_download(repo, allow_patterns=LLM_PATTERNS)
        else:
            hf_hub_download(repo, filename)
    return locate(variant)


def _cache_dir() -> str:
    from huggingface_hub.constants import HF_HUB_CACHE

    return str(HF_HUB_CACHE)


class TarConditioner:
    """prompt -> (LLM) TA-Tok codes -> (TA-Tok decoder) AR-DTok condition features ``[n, width]``."""

    def __init__(self, llm, ta_tok):
        self.llm, self.ta_tok = llm, ta_tok

    def check(self, prompt: str) -> None:
        if not prompt.strip():
            raise ValueError("prompt must not be empty")

    def ignored(self, prompt: str) -> list[str]:
        return []  # a sub-word tokenizer reads every character

    def alias(self, prompt: str) -> None:
        return None  # the LLM reads any prompt

    def __call__(self, prompt: str, seed: int = 0):
        import torch

        self.check(prompt)
        # Its own generator: the AR-DTok stream of a seed is the same whatever the LLM consumed.
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            codes = self.llm.image_codes(prompt, generator)
            device = next(self.ta_tok.parameters()).device
            return self.ta_tok.decode(codes[None].to(device))[0]


def default_dtype(device):
    import torch

    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def build_from_paths(paths: Paths, ratio: int, device="cpu", dtype=None, name="tar", scale=0, n_codes=None):
    """A Family from local files (no pickled code runs; transformers builds Qwen2)."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from mulo.families.base import Family
    from mulo.models.ar_dtok import load_ar_dtok
    from mulo.models.ta_tok import load_ta_tok
    from mulo.models.tar_llm import TarLLM
    from mulo.models.vq16 import load_vq16

    dtype = dtype or default_dtype(device)
    llm_model = Qwen2ForCausalLM.from_pretrained(paths.llm, dtype=dtype).to(device)
    llm = TarLLM(llm_model, AutoTokenizer.from_pretrained(paths.llm), scale=scale, n_codes=n_codes)
    ta_tok = load_ta_tok(paths.ta_tok, device=device, dtype=dtype)
    drafter = load_ar_dtok(paths.drafter, device=device, dtype=dtype)
    target = load_ar_dtok(paths.target, device=device, dtype=dtype)
    for role, model in (("drafter", drafter), ("target", target)):
        if model.config.cond_len < llm.n_codes or model.config.cond_dim != ta_tok.width:
            raise ValueError(
                f"AR-DTok {role} takes up to {model.config.cond_len} x {model.config.cond_dim} condition features; "
                f"TA-Tok gives {llm.n_codes} x {ta_tok.width}"
            )
    th, tw = target.config.grid_hw
    dh, dw = drafter.config.grid_hw
    if (th, tw) != (dh * ratio, dw * ratio):
        raise ValueError(f"target grid {th}x{tw} is not {ratio}x the drafter grid {dh}x{dw}")
    # The VQ tokenizer runs in fp32 (small, and the pixel up/down-sampler compares its codes).
    vq = load_vq16(paths.vq, device=device)
    return Family(
        name, target, {ratio: drafter}, vq, TarConditioner(llm, ta_tok), defaults=DEFAULTS, no_eagle_head=NO_EAGLE_HEAD
    )


# EAGLE-2 drafts with a head trained on the target's own hidden states; nobody has released one
# for AR-DTok and ours are trained on a family's training set, which Tar's is not (2 cores, no data).
NO_EAGLE_HEAD = (
    "no EAGLE head exists for Tar's AR-DTok (none was released, and one is trained on the target's own training data)"
)


def check_available(name: str) -> None:
    """The registry's fast check (``mulo.families``): raises MissingWeights (a FileNotFoundError)
    naming the download command when the variant's files are not in the Hugging Face cache."""
    locate(parse_variant(name))


def load(name: str = "tar", device: str = "cpu"):
    """The registry's entry point (``mulo.families``)."""
    return build(name, device)


def build(name: str = "tar", device: str = "cpu"):
    variant = parse_variant(name)
    # MULO_TAR_DOWNLOAD=1 (a Space's first start) fetches what is missing; otherwise never online.
    paths = download(variant) if os.environ.get("MULO_TAR_DOWNLOAD") == "1" else locate(variant)
    return build_from_paths(paths, variant.ratio, device=device, name=variant.name)
