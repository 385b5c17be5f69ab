"""Every decoding method, declared once: name, generator function, what it needs from a family,
which knobs it reads. The engine, the CLI, the trace schema, the app and the benchmark all read
this table; adding a method is one ``register`` call (see ``tests/test_registry.py``).

A method is a generator function ``generate(ctx: DecodeContext)`` that yields ``Round`` events
and returns the final token grid ``[H, W]`` (``mulo.methods.common``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mulo.config import MULO, MULO_DRAFTING, SAMPLING, ConfigError, keys_in, knob_keys
from mulo.methods import ar, eagle2, gsd, lantern, mc_sjd, sjd, speculative, zipar
from mulo.methods import mulo as mulo_sd

# Knobs every method reads: the target (and any drafter) samples this way.
SAMPLING_KNOBS = keys_in(SAMPLING)  # cfg, temperature, top_k, top_p, aliases


def _needs_draft_model(family, config, method: str) -> None:
    if family.draft_model is None:
        raise ConfigError(f"method {method} needs a same-grid draft model, which family {family.name} lacks")


def _needs_drafter(family, config, method: str) -> None:
    if config.r not in family.drafters:
        raise ConfigError(f"method {method} needs a drafter for r={config.r}, which family {family.name} lacks")


def _needs_learned_upsampler(family, config, method: str) -> None:
    if config.upsampler == "learned" and config.r not in family.upsamplers:
        raise ConfigError(f"upsampler=learned has no model for r={config.r} in family {family.name}")


def _needs_eagle_head(family, config, method: str) -> None:
    if getattr(family, "eagle_head", None) is None:
        why = getattr(family, "no_eagle_head", None) or "none was trained for its target"
        raise ConfigError(f"method {method} needs an EAGLE draft head for family {family.name}: {why}")


# What a method may need beyond the target, checked before it runs. (``config.validate`` also
# refuses an r without a drafter for every request, so "drafter" names the model more than it
# adds a check: the benchmark reads it to know whose steps a method's drafter passes are.)
NEEDS: dict[str, Callable] = {
    "draft_model": _needs_draft_model,  # a small AR model on the target's own grid
    "drafter": _needs_drafter,  # the low-resolution AR model of the request's r
    "learned_upsampler": _needs_learned_upsampler,  # when the request picks upsampler=learned
    "eagle_head": _needs_eagle_head,  # a feature-level draft head trained on the target (EAGLE-2)
}


@dataclass(frozen=True)
class Method:
    name: str  # the CLI's --method, the trace's "method"
    label: str  # how tables and the app title it
    generate: Callable  # generate(ctx) -> generator of Rounds, returning the [H, W] tokens
    summary: str  # one line for --help
    knobs: tuple[str, ...] = ()  # its own knobs (config keys), beside SAMPLING_KNOBS
    needs: tuple[str, ...] = ()  # keys of NEEDS
    chain: bool = False  # verifies a left-to-right chain of drafts: a trace counts them so
    baseline: bool = True  # offered as the app's third column (AR and MuLo-SD always run)
    builtin: bool = True  # False for methods registered at run time (tests, plug-ins)

    def check(self, family, config) -> None:
        """``ConfigError`` if ``family`` lacks what this method needs for ``config``."""
        for need in self.needs:
            NEEDS[need](family, config, self.name)

    def knob_values(self, values: dict) -> dict:
        """The entries of ``values`` this method reads (the others keep the family's values)."""
        return {k: v for k, v in values.items() if k in SAMPLING_KNOBS or k in self.knobs}


REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method; its knobs must be config keys and its needs keys of ``NEEDS``."""
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    name = method.name  # a flag's value and part of a file name: no spaces, no dots
    if not (name[:1].isalpha() and name.replace("-", "_").isidentifier()):
        raise ValueError(f"method name must be letters, digits, _ and -, starting with a letter (got {name!r})")
    unknown = sorted(set(method.knobs) - set(knob_keys())) + sorted(set(method.needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"method {method.name!r}: unknown knobs or needs {', '.join(unknown)}")
    REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    if REGISTRY[name].builtin:
        raise ValueError(f"method {name!r} is built in")
    del REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def baselines() -> tuple[str, ...]:
    return tuple(m.name for m in REGISTRY.values() if m.baseline)


def get(name) -> Method:
    """The method called ``name``, or ``ConfigError`` listing the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ConfigError(f"method must be one of {', '.join(REGISTRY)} (got {name!r})")
    return REGISTRY[name]


MULO_KNOBS = keys_in(MULO, MULO_DRAFTING)  # the knobs config.py groups under MuLo-SD
TREE_KNOBS = ("tree_budget", "tree_depth", "tree_top_k")  # EAGLE-2's draft tree, which LANTERN verifies too

register(Method("ar", "AR", ar.generate, "plain autoregressive decoding, one target pass per token", baseline=False))
register(Method("zipar", "ZipAR", zipar.generate, "ZipAR: rows advance in parallel", knobs=("zipar_window",)))
register(
    Method(
        "sjd", "SJD", sjd.generate, "speculative Jacobi decoding (no draft model)", knobs=("sjd_window",), chain=True
    )
)
register(
    Method(
        "sd", "SD", speculative.generate, "speculative decoding with a same-grid draft model (lossless)",
        knobs=("draft_len",), needs=("draft_model",), chain=True,
    )
)  # fmt: skip
register(
    Method(
        "lantern", "LANTERN", lantern.generate,
        "LANTERN: EAGLE-2's draft trees with relaxed acceptance (codebook neighbours pooled within delta)",
        knobs=(*TREE_KNOBS, "delta", "lantern_k"), needs=("eagle_head",), chain=True,
    )
)  # fmt: skip
register(
    Method(
        "mulo", "MuLo-SD", mulo_sd.generate, "MuLo-SD: low-res drafter, up-sampled drafts, local resampling",
        knobs=MULO_KNOBS, needs=("drafter", "learned_upsampler"), baseline=False,
    )
)  # fmt: skip
register(
    Method(
        "eagle2", "EAGLE-2", eagle2.generate, "EAGLE-2: feature-level draft head, dynamic draft tree (lossless)",
        knobs=TREE_KNOBS, needs=("eagle_head",), chain=True,
    )
)  # fmt: skip
register(
    Method(
        "lantern_chain", "LANTERN-chain", speculative.generate_lantern_chain,
        "LANTERN's relaxed acceptance on a same-grid draft model's chains (the variant before the tree one)",
        knobs=("draft_len", "delta", "lantern_k"), needs=("draft_model",), chain=True, baseline=False,
    )
)  # fmt: skip
# The 2026 front of training-free Jacobi decoding (issue 66): SJD's loop, another verdict each
register(
    Method(
        "mc-sjd", "MC-SJD", mc_sjd.generate,
        "MC-SJD: SJD with drafts coupled across iterations (maximal coupling; lossless)",
        knobs=("sjd_window",), chain=True,
    )
)  # fmt: skip
register(
    Method(
        "gsd", "GSD", gsd.generate,
        "GSD: SJD accepting a draft when its group of likely, nearby tokens passes (lossy)",
        knobs=("sjd_window", "gsd_group", "gsd_gap", "gsd_distance"), chain=True,
    )
)  # fmt: skip
