"""Every knob of a generation request, declared once: default, allowed range, help, UI label, group.

Each knob's *key* names it outside Python: the CLI flag (``rows_per_block`` -> ``--rows-per-block``),
the key in a trace's ``config``, a family's ``defaults.json`` and the app's ``/generate``. The key
is the field's name except for the guidance scale: ``guidance`` in code, ``cfg`` outside, as in
every trace written so far.

``knob_table()`` reads the declarations back as ``Knob`` rows; the CLI's flags, ``validate``, the
app's Advanced panel (one row per group), the ``/generate`` signature and the knob table of
docs/method.md (``python -m mulo knobs``) are all made from it, so a knob added here reaches each.
"""

from __future__ import annotations

import math
import os
import unicodedata
from dataclasses import MISSING, dataclass, field, fields

DRAFTING = ("sequential", "zipar")
RESAMPLING = ("raster", "islands")
UPSAMPLERS = ("pixel", "learned")
MAX_PROMPT_CHARS = 300
MAX_TREE_NODES = 255  # EAGLE-2's draft tree, without its root (a trace's bound too)
LANTERN_K_SHARE = 1000 / 16384  # LANTERN's neighbourhood on LlamaGen's codebook (its paper, MuLo-SD's runs)

# The groups of the app's Advanced panel (one row each, in this order) and of the knob table.
MULO = "MuLo-SD"
MULO_DRAFTING = "MuLo-SD drafting and islands"
BASELINES = "baselines"
SAMPLING = "sampling (every method)"
GROUPS = (MULO, MULO_DRAFTING, BASELINES, SAMPLING)


class ConfigError(ValueError):
    """A request knob is out of range; the message names the knob and what is allowed."""


def shown(value) -> str:
    """A value as a short repr for an error message (a 400-digit number stays one line)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def knob(default, help_text: str, *, label: str, group: str, key: str | None = None, **allowed):
    """A ``GenerationConfig`` field declared as a knob: its default, one-line help, the app's label,
    its group and what it allows (``Knob``'s ``low``/``high``/``step``/``choices``/``vocab_cap``/
    ``auto``/``ratios``)."""
    return field(default=default, metadata=dict(help=help_text, label=label, group=group, key=key, **allowed))


# How the narrow passes run (``mulo.compiled.attach``): here, so the command line offers them
# without importing torch
COMPILE_MODES = ("auto", "on", "off", "cached")
# Which precision wide passes run in (``mulo.wide``): measured per machine, or forced
WIDE_MODES = ("auto", "float32", "bfloat16")


def resolve_mode(mode: str, modes: tuple[str, ...], env: str, what: str) -> str:
    """``mode`` checked against ``modes``; ``auto`` gives way to the environment variable ``env``
    when it is set (checked too). ``what`` names the setting in the error."""
    if mode not in modes:
        raise ValueError(f"{what} must be one of {modes} (got {mode!r})")
    if mode == "auto":
        mode = os.environ.get(env, "auto")
        if mode not in modes:
            raise ValueError(f"{env} must be one of {modes} (got {mode!r})")
    return mode


@dataclass(frozen=True)
class Knob:
    """One knob as every consumer sees it. ``kind`` follows the default: bool, a choice among
    ``choices``, an integer or a number in [``low``, ``high``] (``step``: the app's slider step)."""

    name: str  # the field's name in code
    key: str  # its name outside Python (CLI, traces, defaults.json, /generate)
    default: object
    help: str
    label: str
    group: str
    low: float = 0
    high: float = 0
    step: float = 1
    choices: tuple = ()
    vocab_cap: int | None = None  # the maximum is also at most V + vocab_cap (V: the family's codebook size)
    auto: int | None = None  # a value below the range that means "derive it" (lantern_k's -1)
    ratios: bool = False  # the allowed values are the family's drafter ratios, when known (r)

    @property
    def kind(self) -> str:
        if isinstance(self.default, bool):
            return "bool"
        if self.choices:
            return "choice"
        return "integer" if isinstance(self.default, int) else "number"

    def maximum(self, vocab_size: int | None = None) -> float:
        if self.vocab_cap is None or vocab_size is None:
            return self.high
        return min(self.high, vocab_size + self.vocab_cap)

    def allowed(self, vocab_size: int | None = None, ratios: tuple = ()) -> str:
        """What the knob allows, in words: ``in [0, 8]``, ``one of raster, islands``..."""
        if self.kind == "bool":
            return "true or false"
        options = self.choices or (tuple(ratios) if self.ratios else ())
        if options:
            return "one of " + ", ".join(map(str, options))
        return f"in [{self.low:g}, {self.maximum(vocab_size):g}]"

    def described(self) -> str:
        """What the knob allows before a family is chosen (the CLI's help, the docs' table)."""
        if self.ratios:
            return "one of the family's drafter ratios"
        text = self.allowed()
        if self.vocab_cap is not None:
            text += ", at most V" + (f"{self.vocab_cap:+d}" if self.vocab_cap else "") + " (V: codebook size)"
        return text if self.auto is None else f"{self.auto} (auto), or {text}"

    def check(self, value, vocab_size: int | None = None, ratios: tuple = (), coerce: bool = False):
        """``value`` if this knob allows it, else ``ConfigError`` naming the knob and its range.
        ``coerce``: a whole float counts as an integer and is returned as one (JSON and sliders
        send 3.0 for 3)."""
        kind = self.kind
        if kind == "bool":
            if isinstance(value, bool):
                return value
            raise ConfigError(f"{self.key} must be true or false (got {shown(value)})")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if coerce and number and isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            value = int(value) if kind != "number" else value
        options = self.choices or (tuple(ratios) if self.ratios else ())
        if options:
            if (number or kind == "choice") and not isinstance(value, bool) and value in options:
                return value
            why = " (the family's drafter ratios)" if self.ratios else ""
            raise ConfigError(f"{self.key} must be one of {', '.join(map(str, options))}{why} (got {shown(value)})")
        if kind == "integer":
            valid = isinstance(value, int) and not isinstance(value, bool)
        else:
            valid = number and math.isfinite(value)
        if valid and (self.low <= value <= self.maximum(vocab_size) or value == self.auto):
            return float(value) if kind == "number" and coerce else value
        article = "an integer" if kind == "integer" else "a number"
        auto = f"{self.auto} (auto) or " if self.auto is not None else ""
        raise ConfigError(f"{self.key} must be {auto}{article} {self.allowed(vocab_size)} (got {shown(value)})")


@dataclass
class GenerationConfig:
    # The app's /generate takes the knobs positionally in this order: knobs added later go last,
    # so positional calls written before them keep working. The groups make the app's rows.
    r: int = knob(
        2,
        "resolution ratio target/drafter (a drafter for it must exist)",
        label="r",
        group=MULO,
        low=1,
        high=64,
        ratios=True,
    )
    tau: float = knob(
        0.1,
        "accept a draft token iff its pooled target probability >= tau (> 1: reject all)",
        label="τ (tau)",
        group=MULO,
        high=1.01,
        step=0.01,
    )
    k: int = knob(
        8,
        "codebook neighbours pooled with the draft token (0 = draft token only)",
        label="k",
        group=MULO,
        high=256,
        vocab_cap=-1,
    )
    radius: int = knob(
        1,
        "l: re-open the (2l+1)^2 square around each rejection (never before t0); a radius past the grid "
        "re-opens everything after t0 (raster rejection)",
        label="l (radius)",
        group=MULO,
        high=64,  # the largest grid's side (Tar at 1024 px): every radius that changes anything
    )
    rows_per_block: int = knob(
        0,
        "low-res rows drafted per round; 0 = auto (1 sequential, all rows zipar)",
        label="rows per block",
        group=MULO,
        high=64,
    )
    drafting: str = knob(
        "sequential",
        "low-res drafting: sequential, or ZipAR-parallel (draft_window)",
        label="drafting",
        group=MULO_DRAFTING,
        choices=DRAFTING,
    )
    resampling: str = knob(
        "islands",
        "re-opened set: raster (v1, one target pass per token) or islands (v2)",
        label="resampling",
        group=MULO_DRAFTING,
        choices=RESAMPLING,
    )
    upsampler: str = knob(
        "pixel",
        "pixel: VQ decode, bicubic x r, VQ encode; learned: the family's token up-sampler",
        label="up-sampler",
        group=MULO_DRAFTING,
        choices=UPSAMPLERS,
    )
    draft_window: int = knob(
        4,
        "drafting=zipar: a low-res row starts once the row above has this many tokens",
        label="drafter ZipAR window",
        group=MULO_DRAFTING,
        low=1,
        high=64,
    )
    island_window: int = knob(
        0,
        "ZipAR window inside islands; 0 = raster order inside each island",
        label="island ZipAR window",
        group=MULO_DRAFTING,
        high=64,
    )
    zipar_window: int = knob(
        4,
        "ZipAR: row i+1 starts once row i has this many tokens",
        label="ZipAR window",
        group=BASELINES,
        low=1,
        high=64,
    )
    tree_budget: int = knob(
        60,
        "EAGLE-2 / LANTERN: tokens verified per round (the root and the most confident tree nodes)",
        label="tree budget",
        group=BASELINES,
        low=2,
        high=MAX_TREE_NODES + 1,
    )
    tree_depth: int = knob(
        6,
        "EAGLE-2 / LANTERN: draft-tree depth (drafter passes per round)",
        label="tree depth",
        group=BASELINES,
        low=1,
        high=16,
    )
    tree_top_k: int = knob(
        10,
        "EAGLE-2 / LANTERN: continuations added per expanded node, and nodes expanded per depth",
        label="tree top-k",
        group=BASELINES,
        low=1,
        high=32,
        vocab_cap=0,
    )
    guidance: float = knob(
        4.0,
        "classifier-free guidance scale s: u + s*(c - u); 1 = no guidance",
        key="cfg",
        label="CFG scale",
        group=SAMPLING,
        high=20,
        step=0.5,
    )
    temperature: float = knob(1.0, "0 = greedy (arg-max)", label="temperature", group=SAMPLING, high=5, step=0.05)
    top_k: int = knob(
        0, "keep the k most likely tokens; 0 = off", label="top-k", group=SAMPLING, high=65536, vocab_cap=0
    )
    top_p: float = knob(
        1.0, "nucleus sampling mass; 1 = off", label="top-p", group=SAMPLING, low=0.01, high=1, step=0.01
    )
    aliases: bool = knob(
        True,
        'condition on the emoji name a prompt is the short name of ("pizza" -> "slice of pizza"); emoji '
        "families only, recorded as the trace's condition_text",
        label="emoji aliases",
        group=SAMPLING,
    )
    refresh: bool = knob(
        True,
        "re-encode the target K/V that saw rejected drafts (slots after t0) before resampling and the next "
        "verification read it; off: the stale-K/V ablation",
        label="refresh stale K/V",
        group=MULO,
    )
    sjd_window: int = knob(
        16, "SJD / MC-SJD / GSD: Jacobi window length L", label="SJD window", group=BASELINES, low=1, high=128
    )
    draft_len: int = knob(
        4,
        "SD / LANTERN-chain: draft tokens per verification (gamma)",
        label="SD draft length",
        group=BASELINES,
        low=1,
        high=32,
    )
    delta: float = knob(
        0.4,
        "LANTERN: the neighbour mass c_m pooled onto a draft stays <= delta (> 1: LANTERN++, <= (delta-1)*p(x))",
        label="LANTERN δ",
        group=BASELINES,
        high=10,
        step=0.05,
    )
    lantern_k: int = knob(
        -1,
        "LANTERN: nearest codebook neighbours a draft may pool (its own k, not MuLo-SD's); "
        "-1 = auto: round(V * 1000/16384), LANTERN's k = 1000 on LlamaGen's 16384 codes",
        label="LANTERN k",
        group=BASELINES,
        high=256,
        vocab_cap=-1,
        auto=-1,
    )
    gsd_group: int = knob(
        7,
        "GSD: a draft's group holds the tokens ranked within this many places of it by the target's "
        "probability (0 = the draft alone: SJD's test)",
        label="GSD group reach",
        group=BASELINES,
        high=64,
    )
    gsd_gap: float = knob(
        0.15,
        "GSD: a group member's target probability is within this of the draft's",
        label="GSD probability gap",
        group=BASELINES,
        high=1,
        step=0.01,
    )
    gsd_distance: float = knob(
        1.0,
        "GSD: a group member's squared embedding distance to the draft is below this many times the mean "
        "over pairs of codes (0 = the draft alone)",
        label="GSD embedding distance",
        group=BASELINES,
        high=4,
        step=0.05,
    )

    def to_dict(self) -> dict:
        """Keys -> values (``cfg``, not ``guidance``): a trace's ``config``."""
        return {knob.key: getattr(self, knob.name) for knob in knob_table(type(self))}

    @classmethod
    def from_dict(cls, data: dict) -> GenerationConfig:
        """From keys (``cfg``); a field's own name is accepted too (``guidance``)."""
        table = knob_table(cls)
        names = {k.key: k.name for k in table} | {k.name: k.name for k in table}
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


def knob_table(config_class: type | None = None) -> tuple[Knob, ...]:
    """Every knob of ``config_class`` (default: ``GenerationConfig``, looked up when called) in
    declaration order."""
    table = []
    for f in fields(config_class or GenerationConfig):
        spec = dict(f.metadata)
        key = spec.pop("key") or f.name
        default = f.default if f.default is not MISSING else None
        table.append(Knob(f.name, key, default, spec.pop("help"), **spec))
    return tuple(table)


def knob_keys() -> tuple[str, ...]:
    return tuple(k.key for k in knob_table())


def keys_in(*groups: str) -> tuple[str, ...]:
    """The keys of the knobs in ``groups``."""
    return tuple(k.key for k in knob_table() if k.group in groups)


def validate(config: GenerationConfig, *, vocab_size: int, ratios: tuple[int, ...] = (), grid=None) -> None:
    """Check every knob; ``ratios`` are the family's drafter ratios, ``grid`` the target grid."""
    r = config.r
    if grid is not None and isinstance(r, int) and not isinstance(r, bool) and r >= 1 and (grid[0] % r or grid[1] % r):
        raise ConfigError(f"r={r} does not divide the target grid {grid[0]}x{grid[1]}")
    for knob_row in knob_table(type(config)):
        knob_row.check(getattr(config, knob_row.name), vocab_size, tuple(ratios))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


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


def flags(knob_row: Knob) -> list[str]:
    """The CLI flags of a knob: ``--cfg`` and ``--guidance`` for the guidance scale."""
    names = [knob_row.key] + ([knob_row.name] if knob_row.name != knob_row.key else [])
    return ["--" + name.replace("_", "-") for name in names]


def markdown_table() -> str:
    """docs/method.md's knob table, grouped as the app's Advanced panel is."""
    lines = ["| knob | default | allowed | meaning |", "|---|---|---|---|"]
    for group in GROUPS:
        lines.append(f"| **{group}** | | | |")
        for k in (k for k in knob_table() if k.group == group):
            shown_flags = " or ".join(f"`{f}`" for f in flags(k))
            if k.kind == "bool":
                shown_flags = f"`{flags(k)[0]}` / `--no-{flags(k)[0][2:]}`"
            default = {True: "on", False: "off"}.get(k.default, k.default) if k.kind == "bool" else k.default
            lines.append(f"| {shown_flags} | `{default}` | {k.described()} | {' '.join(k.help.split())} |")
    return "\n".join(lines) + "\n"


def main(argv=None, prog=None) -> int:
    """``python -m mulo knobs``: the knob table of docs/method.md, in Markdown."""
    import argparse

    argparse.ArgumentParser(prog=prog, description="print the knob table (docs/method.md's)").parse_args(argv)
    print(markdown_table(), end="")
    return 0
