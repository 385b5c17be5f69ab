"""Every knob of a generation request, with its default and its allowed range.

Field names are the CLI flags (``--rows-per-block`` -> ``rows_per_block``) and the keys of a
trace's ``config``. ``validate`` turns a bad value into one ``ConfigError`` that names the knob
and the allowed range.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import asdict, dataclass, fields

METHODS = ("ar", "zipar", "sjd", "sd", "lantern", "mulo")
DRAFTING = ("sequential", "zipar")
RESAMPLING = ("raster", "islands")
UPSAMPLERS = ("pixel", "learned")
MAX_PROMPT_CHARS = 300


class ConfigError(ValueError):
    """A request knob is out of range; the message names the knob and what is allowed."""


@dataclass
class GenerationConfig:
    # -- sampling (every method; the target and every drafter sample the same way) -------------
    cfg: float = 4.0  # classifier-free guidance scale u + cfg*(c - u); 1 = no guidance
    temperature: float = 1.0  # 0 = greedy (arg-max)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # nucleus sampling mass; 1 = off
    aliases: bool = True  # condition on the emoji name a prompt is the short name of ("pizza" -> "slice of pizza")
    # -- MuLo-SD ----------------------------------------------------------------------------------
    r: int = 2  # resolution ratio target/drafter (a drafter for it must exist)
    tau: float = 0.1  # accept a draft token iff its pooled target probability >= tau (> 1: reject all)
    k: int = 8  # codebook neighbours pooled with the draft token (0 = draft token only)
    radius: int = 1  # re-open the (2l+1)^2 square around each rejection (never before t0)
    rows_per_block: int = 0  # low-res rows drafted per round; 0 = auto (1 sequential, all rows zipar)
    drafting: str = "sequential"  # low-res drafting: sequential, or ZipAR-parallel (draft_window)
    resampling: str = "islands"  # re-opened set: raster (v1, one target pass per token) or islands (v2)
    upsampler: str = "pixel"  # pixel: VQ decode/resize/encode; learned: the family's token up-sampler
    draft_window: int = 4  # ZipAR window of the drafter when drafting=zipar
    island_window: int = 0  # ZipAR window inside islands; 0 = raster order inside each island
    refresh: bool = True  # re-encode stale target KV (slots >= t0) in the next verification pass
    # -- baselines --------------------------------------------------------------------------------
    zipar_window: int = 4  # ZipAR: row i+1 starts once row i has this many tokens
    sjd_window: int = 16  # SJD: Jacobi window length L
    draft_len: int = 4  # SD/LANTERN: draft tokens per verification (gamma)
    delta: float = 0.4  # LANTERN: total-variation budget of the pooled neighbours (> 1: LANTERN++ ratio)
    lantern_k: int = 8  # LANTERN: codebook neighbours of the draft token it may pool (its own k, not MuLo-SD's)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GenerationConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown knob(s): {', '.join(unknown)}")
        return cls(**data)

    def resolved_rows_per_block(self, low_rows: int) -> int:
        if self.rows_per_block == 0:
            return 1 if self.drafting == "sequential" else low_rows
        return min(self.rows_per_block, low_rows)


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


def validate(cfg: GenerationConfig, *, vocab_size: int, ratios: tuple[int, ...] = (), grid=None) -> None:
    """Check every knob; ``ratios`` are the family's drafter ratios, ``grid`` the target grid."""
    _number("cfg", cfg.cfg, 0, 100)
    _number("temperature", cfg.temperature, 0, 100)
    _number("top_k", cfg.top_k, 0, vocab_size, integer=True)
    _check(
        isinstance(cfg.top_p, (int, float)) and 0 < cfg.top_p <= 1,
        f"top_p must be a number in (0, 1] (got {cfg.top_p!r})",
    )
    _number("tau", cfg.tau, 0)
    _number("k", cfg.k, 0, vocab_size - 1, integer=True)
    _number("lantern_k", cfg.lantern_k, 0, vocab_size - 1, integer=True)
    _number("radius", cfg.radius, 0, 64, integer=True)
    _number("rows_per_block", cfg.rows_per_block, 0, 4096, integer=True)
    _check(cfg.drafting in DRAFTING, f"drafting must be one of {', '.join(DRAFTING)} (got {cfg.drafting!r})")
    _check(cfg.resampling in RESAMPLING, f"resampling must be one of {', '.join(RESAMPLING)} (got {cfg.resampling!r})")
    _check(cfg.upsampler in UPSAMPLERS, f"upsampler must be one of {', '.join(UPSAMPLERS)} (got {cfg.upsampler!r})")
    _number("draft_window", cfg.draft_window, 1, 4096, integer=True)
    _number("island_window", cfg.island_window, 0, 4096, integer=True)
    _check(isinstance(cfg.refresh, bool), f"refresh must be true or false (got {cfg.refresh!r})")
    _check(isinstance(cfg.aliases, bool), f"aliases must be true or false (got {cfg.aliases!r})")
    _number("zipar_window", cfg.zipar_window, 1, 4096, integer=True)
    _number("sjd_window", cfg.sjd_window, 1, 4096, integer=True)
    _number("draft_len", cfg.draft_len, 1, 256, integer=True)
    _number("delta", cfg.delta, 0, 100)
    _number("r", cfg.r, 1, 64, integer=True)
    if grid is not None:
        h, w = grid
        _check(h % cfg.r == 0 and w % cfg.r == 0, f"r={cfg.r} does not divide the target grid {h}x{w}")
    if ratios:
        allowed = ", ".join(str(x) for x in ratios)
        _check(cfg.r in ratios, f"r must be one of {allowed} (the drafters of this family; got {cfg.r})")


def validate_method(method: str) -> None:
    _check(method in METHODS, f"method must be one of {', '.join(METHODS)} (got {method!r})")


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
