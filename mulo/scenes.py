"""The emoji scenes family's language (issue 63): its vocabulary of emoji, its background
palette, the prompt grammar and the split of held-out (emoji pair, background) combinations.

A scene is a 128 px canvas of one background colour with 1 to 3 small emoji on it, each in any of
the five licensed styles (``mulo.train.styles``). Its prompt names the emoji, the background and,
optionally, one style for all of them::

    red apple on blue
    red apple and rocket on yellow
    cat, pizza and rocket on green in noto style

Light on purpose (standard library only): the app, the CLI, the referee (``mulo.eval.referee``)
and the training generator (``mulo.train.scenes``) all read prompts through this module.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Emoji:
    name: str  # the prompt words that ask for it
    code: str  # emoji.json's unified code point(s)


# Well-known emoji that every one of the five styles draws, chosen to look unlike each other at
# 32 px (one tree, one fish, no look-alike faces). Listed so that any prefix of the list mixes
# food, animals, objects and nature: a study on a smaller vocabulary takes the first N.
VOCABULARY = (
    Emoji("red apple", "1F34E"), Emoji("rocket", "1F680"), Emoji("cat", "1F431"), Emoji("sun", "2600"),
    Emoji("banana", "1F34C"), Emoji("soccer ball", "26BD"), Emoji("frog", "1F438"), Emoji("red heart", "2764"),
    Emoji("pizza", "1F355"), Emoji("car", "1F697"), Emoji("penguin", "1F427"), Emoji("rainbow", "1F308"),
    Emoji("grapes", "1F347"), Emoji("umbrella", "2602"), Emoji("dog", "1F436"), Emoji("star", "2B50"),
    Emoji("watermelon", "1F349"), Emoji("crown", "1F451"), Emoji("octopus", "1F419"), Emoji("snowflake", "2744"),
    Emoji("hamburger", "1F354"), Emoji("guitar", "1F3B8"), Emoji("pig", "1F437"), Emoji("fire", "1F525"),
    Emoji("strawberry", "1F353"), Emoji("house", "1F3E0"), Emoji("unicorn", "1F984"), Emoji("cactus", "1F335"),
    Emoji("doughnut", "1F369"), Emoji("light bulb", "1F4A1"), Emoji("butterfly", "1F98B"), Emoji("ghost", "1F47B"),
    Emoji("lemon", "1F34B"), Emoji("key", "1F511"), Emoji("panda", "1F43C"), Emoji("crescent moon", "1F319"),
    Emoji("carrot", "1F955"), Emoji("balloon", "1F388"), Emoji("turtle", "1F422"), Emoji("sunflower", "1F33B"),
    Emoji("birthday cake", "1F382"), Emoji("bicycle", "1F6B2"), Emoji("lion", "1F981"), Emoji("cloud", "2601"),
    Emoji("cherries", "1F352"), Emoji("airplane", "2708"), Emoji("snail", "1F40C"), Emoji("tree", "1F333"),
    Emoji("pineapple", "1F34D"), Emoji("trophy", "1F3C6"), Emoji("fox", "1F98A"), Emoji("droplet", "1F4A7"),
    Emoji("avocado", "1F951"), Emoji("bell", "1F514"), Emoji("crab", "1F980"), Emoji("rose", "1F339"),
    Emoji("mushroom", "1F344"), Emoji("sailboat", "26F5"), Emoji("rabbit", "1F430"), Emoji("alien", "1F47D"),
    Emoji("croissant", "1F950"), Emoji("anchor", "2693"), Emoji("lady beetle", "1F41E"), Emoji("robot", "1F916"),
)  # fmt: skip
NAMES = tuple(e.name for e in VOCABULARY)

# Background colours: Twemoji's own palette, the colours its VQ saw most. Grey (#99AAB5), black
# (#292F33) and brown (#C1694F) are left out: the shipped twemoji VQ reconstructs a flat field of
# them as purple, green and a second red (measured), and a referee could not tell them apart.
PALETTE = {
    "white": (255, 255, 255),
    "yellow": (255, 204, 77),
    "orange": (244, 144, 12),
    "red": (221, 46, 68),
    "pink": (244, 171, 186),
    "green": (119, 178, 85),
    "blue": (85, 172, 238),
    "purple": (170, 142, 214),
}
# The five licensed styles' prompt words (``mulo.train.styles.STYLE_WORDS``; a test keeps them equal).
STYLE_WORDS = ("twemoji", "noto", "openmoji", "fluent", "fluentcolor")
MAX_OBJECTS = 3
HELD_OUT_FRACTION = 0.05  # of the (emoji pair, background) combinations
SPLIT_SEED = 63

ARTICLES = frozenset(["a", "an", "the"])
SEPARATORS = frozenset([",", "and", "&", "+"])


class PromptError(ValueError):
    """A prompt the scenes grammar cannot read; the message names the problem and a fix."""


@dataclass(frozen=True)
class ScenePrompt:
    objects: tuple[str, ...]  # vocabulary names, in the prompt's order
    background: str | None  # a palette colour, None when the prompt names none (any background)
    style: str | None = None  # one style word for every object, None for any

    def text(self) -> str:
        return format_prompt(self.objects, self.background, self.style)


def format_prompt(objects, background: str | None = None, style: str | None = None) -> str:
    """The canonical prompt: "red apple, rocket and cat on blue in noto style"."""
    objects = list(objects)
    if not objects:
        raise PromptError("a scene prompt names at least one emoji")
    listed = objects[0] if len(objects) == 1 else f"{', '.join(objects[:-1])} and {objects[-1]}"
    text = listed if background is None else f"{listed} on {background}"
    return text if style is None else f"{text} in {style} style"


def _tokens(text: str) -> list[str]:
    """Lower-case words and the list separators ("t-shirt" -> "t", "shirt"; "a, b" -> "a", ",", "b")."""
    return re.findall(r"[a-z0-9]+|[,&+]", text.lower())


def nearest_names(name: str, names=NAMES, count: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(names), n=count, cutoff=0.5)


def _split_known(words: list[str], names) -> list[str] | None:
    """``words`` as a run of known names without separators ("red apple rocket"), or None."""
    known, best = set(names), {0: []}
    for end in range(1, len(words) + 1):
        for start in range(end):
            if start in best and " ".join(words[start:end]) in known:
                best[end] = [*best[start], " ".join(words[start:end])]
                break
    return best.get(len(words)) if len(words) in best and len(best[len(words)]) > 1 else None


def _unknown_emoji(name: str, names) -> PromptError:
    parts = _split_known(name.split(), names)
    if parts:
        return PromptError(f"unknown emoji {name!r}: did you mean {format_prompt(parts)!r}?")
    near = nearest_names(name, names)
    if near:
        return PromptError(f"unknown emoji {name!r}; nearest known: {', '.join(near)}")
    return PromptError(f"unknown emoji {name!r}; this family draws: {', '.join(names)}")


def parse_prompt(text: str, max_objects: int = MAX_OBJECTS, names=NAMES, palette=PALETTE) -> ScenePrompt:
    """Read a scene prompt: emoji names separated by commas or "and", then "on COLOUR", then
    optionally a style ("in noto style", "noto"). Raises PromptError naming what is wrong."""
    tokens = _tokens(text)
    if tokens[-1:] == ["style"]:
        tokens = tokens[:-1]
        if not tokens or tokens[-1] not in STYLE_WORDS:
            raise PromptError(f"'style' must follow a style word: {', '.join(STYLE_WORDS)}")
    style = None
    if tokens and tokens[-1] in STYLE_WORDS:
        style, tokens = tokens[-1], tokens[:-1]
        if tokens[-1:] == ["in"]:
            tokens = tokens[:-1]
    background = None
    if "on" in tokens:
        at = len(tokens) - 1 - tokens[::-1].index("on")
        colour = " ".join(t for t in tokens[at + 1 :] if t != ",")
        tokens = tokens[:at]
        if not colour:
            raise PromptError(f"nothing after 'on': name a background colour ({', '.join(palette)})")
        if colour not in palette:
            near = difflib.get_close_matches(colour, list(palette), n=2, cutoff=0.5)
            hint = f" (nearest: {', '.join(near)})" if near else ""
            raise PromptError(f"unknown background colour {colour!r}{hint}; the colours are {', '.join(palette)}")
        background = colour
    objects, current = [], []
    for token in [*tokens, ","]:
        if token in SEPARATORS:
            if current:
                objects.append(" ".join(current))
            current = []
        elif token not in ARTICLES or current:
            current.append(token)
    if not objects:
        raise PromptError("the prompt names no emoji: write e.g. 'red apple and rocket on blue'")
    unknown = [name for name in objects if name not in names]
    if unknown:
        raise _unknown_emoji(unknown[0], names)
    twice = sorted({name for name in objects if objects.count(name) > 1})
    if twice:
        raise PromptError(f"the prompt names {', '.join(twice)} twice; a scene shows each emoji at most once")
    if len(objects) > max_objects:
        raise PromptError(f"the prompt names {len(objects)} emoji; this family draws at most {max_objects}")
    return ScenePrompt(tuple(objects), background, style)


def read_scene_text(
    text: str, max_objects: int = MAX_OBJECTS, names=NAMES, palette=PALETTE, styles=STYLE_WORDS
) -> tuple[ScenePrompt, tuple[str | None, ...]]:
    """A prompt (``parse_prompt``'s grammar) or a scene's description, which puts a style word
    after each name ("red apple noto, rocket twemoji on blue"): the prompt without those words
    and each object's style (its own, else the prompt's one style, else None)."""
    words, kept, own = _tokens(text), [], {}
    for i, word in enumerate(words):
        # a description's style word ends its object: a separator or "on" follows it
        if word in styles and kept and words[i + 1 : i + 2] and (words[i + 1] in SEPARATORS or words[i + 1] == "on"):
            own[sum(w in SEPARATORS for w in kept)] = word
        else:
            kept.append(word)
    prompt = parse_prompt(" ".join(kept), max_objects, names, palette)
    return prompt, tuple(own.get(k, prompt.style) for k in range(len(prompt.objects)))


def symbol_slots(
    text: str, max_objects: int = MAX_OBJECTS, names=NAMES, palette=PALETTE, styles=STYLE_WORDS
) -> list[tuple[int, ...]]:
    """What a prompt (or description) says, as symbols: slot 0 the background colour, then one slot
    per object, each a tuple of indices into the table ``[*names, *palette, *styles]`` (an empty
    tuple: the prompt leaves it open, e.g. no background named). An object's slot holds its name
    and, when the text gives it, its style: exact words a model reads without a text encoder."""
    prompt, own = read_scene_text(text, max_objects, names, palette, styles)
    names, colours = list(names), list(palette)
    background = () if prompt.background is None else (len(names) + colours.index(prompt.background),)
    objects = [
        (names.index(name),) + (() if style is None else (len(names) + len(colours) + list(styles).index(style),))
        for name, style in zip(prompt.objects, own, strict=True)
    ]
    return [background, *objects]


def _fraction(*parts: str) -> float:
    """A stable number in [0, 1) of ``parts``: a split that no change of the vocabulary moves."""
    digest = hashlib.sha256(":".join([str(SPLIT_SEED), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out_combination(first: str, second: str, background: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    """Whether the pair of emoji (in either order) on ``background`` is held out of training."""
    a, b = sorted((first, second))
    return _fraction(a, b, background) < fraction


def held_out_pairs(objects, background: str, fraction: float = HELD_OUT_FRACTION) -> list[tuple[str, str]]:
    """The held-out (emoji pair) combinations a scene of ``objects`` on ``background`` holds."""
    objects = list(objects)
    pairs = [(a, b) for i, a in enumerate(objects) for b in objects[i + 1 :]]
    return [pair for pair in pairs if held_out_combination(*pair, background, fraction)]
