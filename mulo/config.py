"""Every knob of a generation request, with its default and its allowed range.

Each knob's *key* names it outside Python: the CLI flag (``rows_per_block`` -> ``--rows-per-block``),
the key in a trace's ``config``, a family's ``defaults.json`` and the app's ``/generate``. The key
is the field's name except for the guidance scale: ``guidance`` in code, ``cfg`` outside, as in
every trace written so far. ``validate`` turns a bad value into one ``ConfigError`` that names the
knob (by key) and the allowed range.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field, fields

DRAFTING = ("sequential", "zipar")
RESAMPLING = ("raster", "islands")
UPSAMPLERS = ("pixel", "learned")
MAX_PROMPT_CHARS = 300
MAX_TREE_NODES = 255  # EAGLE-2's draft tree, without its root (a trace's bound too)
LANTERN_K_SHARE = 1000 / 16384  # LANTERN's neighbourhood on LlamaGen's codebook (its paper, MuLo-SD's runs)


class ConfigError(ValueError):
    """A request knob is out of range; the message names the knob and what is allowed."""


def knob(default, help_text: str, key: str | None = None):
    """A ``GenerationConfig`` field: its default, its ``--help`` line and its key (default: its name)."""
    metadata = {"help": help_text} if key is None else {"help": help_text, "key": key}
    return field(default=default, metadata=metadata)


@dataclass
class GenerationConfig:
    # -- sampling (every method; the target and every drafter sample the same way) -------------
    guidance: float = knob(4.0, "classifier-free guidance scale s: u + s*(c - u); 1 = no guidance", key="cfg")
    temperature: float = knob(1.0, "0 = greedy (arg-max)")
    top_k: int = knob(0, "keep the k most likely tokens; 0 = off")
    top_p: float = knob(1.0, "nucleus sampling mass; 1 = off")
    aliases: bool = knob(
        True, 'condition on the emoji name a prompt is the short name of ("pizza" -> "slice of pizza")'
    )
    # -- MuLo-SD ----------------------------------------------------------------------------------
    r: int = knob(2, "resolution ratio target/drafter (a drafter for it must exist)")
    tau: float = knob(0.1, "accept a draft token iff its pooled target probability >= tau (> 1: reject all)")
    k: int = knob(8, "codebook neighbours pooled with the draft token (0 = draft token only)")
    radius: int = knob(1, "re-open the (2l+1)^2 square around each rejection (never before t0)")
    rows_per_block: int = knob(0, "low-res rows drafted per round; 0 = auto (1 sequential, all rows zipar)")
    drafting: str = knob("sequential", "low-res drafting: sequential, or ZipAR-parallel (draft_window)")
    resampling: str = knob("islands", "re-opened set: raster (v1, one target pass per token) or islands (v2)")
    upsampler: str = knob("pixel", "pixel: VQ decode/resize/encode; learned: the family's token up-sampler")
    draft_window: int = knob(4, "ZipAR window of the drafter when drafting=zipar")
    island_window: int = knob(0, "ZipAR window inside islands; 0 = raster order inside each island")
    refresh: bool = knob(True, "re-encode target K/V that saw rejected drafts before it is read (off: the ablation)")
    # -- baselines --------------------------------------------------------------------------------
    zipar_window: int = knob(4, "ZipAR: row i+1 starts once row i has this many tokens")
    sjd_window: int = knob(16, "SJD: Jacobi window length L")
    draft_len: int = knob(4, "SD / LANTERN-chain: draft tokens per verification (gamma)")
    delta: float = knob(
        0.4, "LANTERN: the neighbour mass c_m pooled onto a draft stays <= delta (> 1: LANTERN++, <= (delta-1)*p(x))"
    )
    lantern_k: int = knob(
        -1,
        "LANTERN: nearest codebook neighbours a draft may pool (its own k, not MuLo-SD's); -1 = auto: "
        "round(V * 1000/16384), LANTERN's k = 1000 on LlamaGen's 16384 codes (2 of twemoji's 32)",
    )
    tree_budget: int = knob(
        60, "EAGLE-2 / LANTERN: tokens verified per round (the root and the most confident tree nodes)"
    )
    tree_depth: int = knob(6, "EAGLE-2 / LANTERN: draft-tree depth (drafter passes per round)")
    tree_top_k: int = knob(10, "EAGLE-2 / LANTERN: continuations added per expanded node, and nodes expanded per depth")

    def to_dict(self) -> dict:
        """Keys -> values (``cfg``, not ``guidance``): a trace's ``config``."""
        return {key_of(f): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> GenerationConfig:
        """From keys (``cfg``); a field's own name is accepted too (``guidance``)."""
        names = {key_of(f): f.name for f in fields(cls)} | {f.name: f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(f"unknown knob(s): {', '.join(unknown)}")
        values = {names[k]: v for k, v in data.items()}
        if len(values) < len(data):
            raise ConfigError("the guidance scale is given twice (as cfg and as guidance)")
        return cls(**values)

    def resolved_lantern_k(self, vocab_size: int) -> int:
        """``lantern_k``, or for -1 the share of the codebook LANTERN pools on LlamaGen (k = 1000 of
        16384 codes, about 6 %), at least one neighbour and at most every other code."""
        if self.lantern_k >= 0:
            return self.lantern_k
        return min(vocab_size - 1, max(1, round(vocab_size * LANTERN_K_SHARE)))

    def resolved_rows_per_block(self, low_rows: int) -> int:
        if self.rows_per_block == 0:
            return 1 if self.drafting == "sequential" else low_rows
        return min(self.rows_per_block, low_rows)


def key_of(f) -> str:
    """The key of a ``GenerationConfig`` field outside Python."""
    return f.metadata.get("key", f.name)


def knob_keys() -> tuple[str, ...]:
    return tuple(key_of(f) for f in fields(GenerationConfig))


def knob_help() -> dict[str, str]:
    """Key -> one-line explanation (the CLI's --help)."""
    return {key_of(f): f.metadata["help"] for f in fields(GenerationConfig)}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _number(name: str, value, low: float, high: float = math.inf, integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    valid = (
        isinstance(value, int) and not isinstance(value, bool)
        if integer
        else (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    )
    bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
    _check(valid and low <= value <= high, f"{name} must be {kind} {bounds} (got {value!r})")


def validate(config: GenerationConfig, *, vocab_size: int, ratios: tuple[int, ...] = (), grid=None) -> None:
    """Check every knob; ``ratios`` are the family's drafter ratios, ``grid`` the target grid."""
    _number("cfg", config.guidance, 0, 100)
    _number("temperature", config.temperature, 0, 100)
    _number("top_k", config.top_k, 0, vocab_size, integer=True)
    _check(
        isinstance(config.top_p, (int, float)) and 0 < config.top_p <= 1,
        f"top_p must be a number in (0, 1] (got {config.top_p!r})",
    )
    _number("tau", config.tau, 0)
    _number("k", config.k, 0, vocab_size - 1, integer=True)
    _check(
        isinstance(config.lantern_k, int) and not isinstance(config.lantern_k, bool)
        and -1 <= config.lantern_k <= vocab_size - 1,
        f"lantern_k must be -1 (auto) or an integer in [0, {vocab_size - 1}] (got {config.lantern_k!r})",
    )  # fmt: skip
    _number("radius", config.radius, 0, 64, integer=True)
    _number("rows_per_block", config.rows_per_block, 0, 4096, integer=True)
    _check(config.drafting in DRAFTING, f"drafting must be one of {', '.join(DRAFTING)} (got {config.drafting!r})")
    _check(
        config.resampling in RESAMPLING,
        f"resampling must be one of {', '.join(RESAMPLING)} (got {config.resampling!r})",
    )
    _check(
        config.upsampler in UPSAMPLERS, f"upsampler must be one of {', '.join(UPSAMPLERS)} (got {config.upsampler!r})"
    )
    _number("draft_window", config.draft_window, 1, 4096, integer=True)
    _number("island_window", config.island_window, 0, 4096, integer=True)
    _check(isinstance(config.refresh, bool), f"refresh must be true or false (got {config.refresh!r})")
    _check(isinstance(config.aliases, bool), f"aliases must be true or false (got {config.aliases!r})")
    _number("zipar_window", config.zipar_window, 1, 4096, integer=True)
    _number("sjd_window", config.sjd_window, 1, 4096, integer=True)
    _number("draft_len", config.draft_len, 1, 256, integer=True)
    _number("delta", config.delta, 0, 100)
    _number("tree_budget", config.tree_budget, 2, MAX_TREE_NODES + 1, integer=True)
    _number("tree_depth", config.tree_depth, 1, 32, integer=True)
    _number("tree_top_k", config.tree_top_k, 1, min(64, vocab_size), integer=True)
    _number("r", config.r, 1, 64, integer=True)
    if grid is not None:
        h, w = grid
        _check(h % config.r == 0 and w % config.r == 0, f"r={config.r} does not divide the target grid {h}x{w}")
    if ratios:
        allowed = ", ".join(str(x) for x in ratios)
        _check(config.r in ratios, f"r must be one of {allowed} (the drafters of this family; got {config.r})")


def validate_prompt(prompt) -> str:
    """The prompt with whitespace collapsed; ``ConfigError`` for non-text, empty or long prompts."""
    _check(isinstance(prompt, str), f"prompt must be a string (got {type(prompt).__name__})")
    _check(len(prompt) <= 4 * MAX_PROMPT_CHARS, f"prompt must be at most {MAX_PROMPT_CHARS} characters")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: it would fail later, when the trace is written
        raise ConfigError(f"prompt is not valid text (an unpaired surrogate at character {exc.start})") from None
    controls = sorted({f"U+{ord(c):04X}" for c in prompt if unicodedata.category(c) == "Cc" and not c.isspace()})
    _check(not controls, f"prompt must not contain control characters (found {', '.join(controls[:5])})")
    text = " ".join(prompt.split())
    _check(bool(text), "prompt must not be empty")
    _check(len(text) <= MAX_PROMPT_CHARS, f"prompt must be at most {MAX_PROMPT_CHARS} characters (got {len(text)})")
    return text


def validate_seed(seed) -> int:
    _check(
        isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63,
        f"seed must be an integer in [0, 2^63) (got {seed!r})",
    )
    return seed
