"""The app's inputs: what a request may carry, checked by us with messages that name the knob.

Gradio's own components convert and range-check values before a handler runs, with generic
messages ("Value -1 is less than minimum value 0.") or none at all (a string where a number
belongs ends as "upstream ... exception"), and a seed passes through a float. The ``Raw*``
components below render exactly like gradio's (``is_template``) but hand the request's value to
``parse_request`` untouched, and document in the API the types it really accepts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from mulo.config import ConfigError, shown, validate_prompt

SEED_LIMIT = 2**63  # seeds are integers in [0, 2^63): torch.Generator.manual_seed's range
SEED_DIGITS = 19


class RawSlider(gr.Slider):
    is_template = True  # the frontend of gr.Slider

    def preprocess(self, payload):
        return payload  # checked by parse_request, which names the knob and its range

    def api_info(self):
        kind = "integer" if self.step == 1 and float(self.minimum).is_integer() else "number"
        return {"type": kind, "minimum": self.minimum, "maximum": self.maximum}


class RawRadio(gr.Radio):
    is_template = True

    def preprocess(self, payload):
        return payload

    def api_info(self):
        values = [value for _, value in self.choices]
        kind = "integer" if all(isinstance(v, int) for v in values) else "string"
        return {"type": kind, "enum": values}


class RawCheckbox(gr.Checkbox):
    is_template = True

    def preprocess(self, payload):
        return payload  # a non-boolean is reported by parse_request, not read as truthy

    def api_info(self):
        return {"type": "boolean"}


class RawDropdown(gr.Dropdown):
    is_template = True

    def preprocess(self, payload):
        return payload


class RawText(gr.Textbox):
    is_template = True

    def preprocess(self, payload):
        return payload  # a non-string prompt is reported, not turned into text


class SeedBox(gr.Textbox):
    """The seed as typed: a browser's number input would round seeds above 2^53."""

    is_template = True

    def preprocess(self, payload):
        return payload

    def postprocess(self, value):
        return None if value is None else str(value)

    def api_info(self):
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": SEED_LIMIT - 1},
                {"type": "string", "pattern": f"^[0-9]{{1,{SEED_DIGITS}}}$"},
            ],
            "description": "an integer in [0, 2^63), or its decimal digits",
        }

    def example_payload(self):
        return 0

    def example_value(self):
        return 0


def parse_seed(seed) -> int:
    """A seed exactly: an int, its decimal digits, or a float holding an exact integer."""
    value = None
    if isinstance(seed, int) and not isinstance(seed, bool):
        value = seed
    elif isinstance(seed, str) and seed.strip().isascii() and seed.strip().isdigit():
        digits = seed.strip()
        value = int(digits) if len(digits) <= SEED_DIGITS else SEED_LIMIT
    elif isinstance(seed, float) and math.isfinite(seed) and seed.is_integer() and abs(seed) <= 2**53:
        value = int(seed)  # exact: a float holds every integer up to 2^53
    if value is None or not 0 <= value < SEED_LIMIT:
        raise ConfigError(f"seed must be an integer in [0, 2^63) (got {shown(seed)})")
    return value


@dataclass
class GenerateRequest:
    """One click of Generate (or one /generate call), checked: what the engine will be asked."""

    prompt: str
    seed: int
    family: str
    third: str
    knobs: dict  # GenerationConfig keys -> values; knobs left empty take the family's defaults


def parse_request(prompt, seed, family, third, knob_values: dict, table, bounds_for, families, baselines):
    """Check every field of a request before any model runs; raise ``ConfigError`` on the first
    problem. ``table``: ``config.knob_table()``; ``bounds_for(family)``: that family's codebook size
    and drafter ratios (called once the family name is known to be valid)."""
    if prompt is None:
        raise ConfigError("prompt is required")
    prompt = validate_prompt(prompt)
    if seed is None or seed == "":
        raise ConfigError("seed is required: an integer in [0, 2^63)")
    seed = parse_seed(seed)
    if not isinstance(family, str) or family not in families:
        raise ConfigError(f"family must be one of {', '.join(families)} (got {shown(family)})")
    if not isinstance(third, str) or third not in baselines:
        raise ConfigError(f"third method must be one of {', '.join(baselines)} (got {shown(third)})")
    vocab_size, ratios = bounds_for(family)
    values = {}
    for knob in table:
        value = knob_values.get(knob.key)
        if value is not None:
            values[knob.key] = knob.check(value, vocab_size, ratios, coerce=True)
    return GenerateRequest(prompt, seed, family, third, values)
