"""The app's Markdown: the explainer, the metrics legend, a run's headline numbers, a round's
line, a token's history and a replay's summary. Every string from a trace is shown with ``plain``
(trace files are shared: their text is data, never markup)."""

from __future__ import annotations

import numpy as np

from mulo.trace import Trace
from mulo.ui import viz
from mulo.ui.markdown import plain

METRICS_LEGEND = """
**wall time**: seconds from request to decoded image on this machine (drawing excluded) ·
**wall-clock speed-up**: AR wall time / this method's, same prompt, seed and settings (one request on
a shared CPU: noisy) · **cost speed-up**: AR's forward passes / this method's, each pass priced by its
model and width from pass timings kept since the app started (the same work always shows the same
number) · **matches the prompt**: the family's mini-CLIP ranks the prompted emoji among its 5 nearest
texts for this image (the benchmark's adherence) · **differ from AR's**: tokens unlike AR's image for
the same seed ·
**NFE**: forward passes of the target and of the drafter (a CFG pair counts once) ·
**rounds**: draft → verify → resample blocks (AR and ZipAR: one per row of work) ·
**acceptance**: accepted draft tokens / proposed draft tokens ·
**re-opened**: positions re-opened and resampled by the target / all positions; MuLo-SD re-opens the
(2l+1)² square around each rejection after t0, so an accepted draft beside a rejection is re-opened
too (striped green in the maps), and acceptance and re-opened can both be high
"""

EXPLAINER = """
MuLo-SD drafts the image with a **low-resolution** AR model, **up-samples** the draft tokens ×r,
**verifies** all of them in one pass of the high-resolution target, **accepts** a token when the
target probability pooled over the draft token and its k nearest codebook neighbours reaches τ,
**re-opens** only the (2l+1)² neighbourhood of each rejection (never before the first one, t0) and
**resamples** those islands, in parallel. Colours: <span style="color:#16a34a">■ accepted</span>
<span style="color:#dc2626">■ rejected</span> <span style="color:#f59e0b">■ re-opened</span>
<span style="color:#2563eb">■ t0</span>.
"""


PAPER_URL = "https://arxiv.org/abs/2601.05149"


def header(code_url: str | None) -> str:
    """The page's title lines: what this is, the paper (title, authors, link) and the code."""
    code = f"[code]({code_url})" if code_url else "code: the `mulo` package this app runs (MIT licence)"
    return (
        "# mulo: watch MuLo-SD speculative decoding draw an image, round by round\n"
        f"Paper: [*Multi-Scale Local Speculative Decoding for Image Generation*]({PAPER_URL}), "
        f"Elia Peruzzo, Guillaume Sautière and Amirhossein Habibian (Qualcomm AI Research), CVPR 2026 · {code}. "
        "Plain AR decoding and MuLo-SD run on the same prompt and seed; every round of speculative "
        "decoding is below, with what each token's verdict was."
    )


TOKEN_HINT = (
    "Click a token of the verdict map to see its history. *code*: the token's index in the VQ "
    "codebook; *wave*: within a round the target resamples every island at once in waves, one pass "
    "each, every island advancing by a token per wave (by one in each of its rows with a ZipAR "
    "window), so a token resampled in wave 2 saw the tokens of wave 1."
)


def stats_markdown(trace: Trace, baseline: Trace | None, score=None, reference: float | None = None) -> str:
    """A column's numbers: speed (wall clock and, with ``score``, the cost speed-up), quality
    beside it (``score``: ``mulo.ui.scoring.ColumnScore``; ``reference``: the real images' adherence)
    and what the run did, in words."""
    s = trace.summary()
    is_base = baseline is None or trace is baseline
    wall = "" if is_base else f" · **{baseline.latency_s / trace.latency_s:.2f}×** wall-clock"
    cost = f" · **{score.cost_speedup:.2f}×** cost" if score is not None and score.cost_speedup and not is_base else ""
    c = trace.config
    lines = [
        f"**{trace.latency_s:.2f} s**{wall}{cost} · NFE target {s['nfe']['target']}, "
        f"drafter {s['nfe']['drafter']} · {s['rounds']} rounds",
    ]
    if score is not None:
        lines.append(quality_line(score, reference, is_base))
    lines += [
        verdict_sentence(s)
        + (f" · {s['mean_accepted_length']:.2f} tokens per round" if s["mean_accepted_length"] else "")
        + (f" · {s['mean_tree_size']:.1f} tree nodes per round" if s["mean_tree_size"] else ""),
        f"<small>{plain(viz.method_name(trace.method), 64)} · cfg {c['cfg']} · temperature {c['temperature']} · "
        f"top-k {c['top_k']} · top-p {c['top_p']} · seed {trace.seed}{_kv_mode(trace)} · "
        f"{plain(trace.device, 64)}</small>",
    ]
    # every string below may come from a shared trace file: shown as text, never as markup
    if trace.condition_text:
        lines.append(
            f"conditioned on *{plain(trace.condition_text)}* (the emoji whose short name is *{plain(trace.prompt)}*)"
        )
    if score is not None and score.warning:
        lines.append(f"**Warning:** {score.warning}")
    if trace.warnings:
        lines.append(f"**Note:** {plain('; '.join(trace.warnings), 600)}")
    return "  \n".join(lines)


def quality_line(score, reference: float | None, is_base: bool) -> str:
    """Prompt match (the family's mini-CLIP) and the share of tokens that differ from AR's."""
    if score.verdict is not None:  # the family's referee: what it found and what is missing
        ref = f" (real scenes: {reference:.0%} match)" if reference is not None else ""
        match = f"referee: {score.verdict}{ref}".replace("referee: matches", "referee: **matches**", 1)
        match = match.replace("referee: does not match", "referee: does **not** match", 1)
    elif score.rank is None:
        match = "prompt match: not scored (the prompt names no emoji the family's scorer knows)"
    else:
        verdict = "matches the prompt" if score.adherent else "does **not** match the prompt"
        ref = f"; real images: {reference:.0%} do" if reference is not None else ""
        match = f"{verdict} (its emoji ranks {score.rank:,} of {score.texts:,} texts, top 5 counts{ref})"
    if is_base or score.differs_from_ar is None:
        return match
    return f"{match} · {score.differs_from_ar:.0%} of tokens differ from AR's"


def verdict_sentence(s: dict) -> str:
    """A run's drafts in words (``s``: ``Trace.summary()``): how many were accepted, and how much
    of the image was re-opened around how many rejections, which is how both can be large at once
    (an accepted draft next to a rejection is re-opened too)."""
    if not s["proposed"]:
        return "no drafts: the target decoded every token"
    sentence = f"accepted {s['accepted']:,} of {s['proposed']:,} drafts ({s['acceptance_rate']:.1%})"
    if s["reopened"]:
        sentence += (
            f"; re-opened {s['reopened']:,} tokens ({s['reopened_fraction']:.1%} of the image) around "
            f"{s['rejected']:,} rejection{'s' if s['rejected'] != 1 else ''}"
        )
    return sentence


def _kv_mode(trace: Trace) -> str:
    """Which K/V MuLo-SD's resampling read: exact contexts, or the stale-K/V ablation."""
    if trace.method != "mulo" or "refresh" not in trace.config:
        return ""
    return " · K/V re-encoded after rejections" if trace.config["refresh"] else " · stale K/V (ablation: no refresh)"


def replay_summary(trace: Trace, decoded: bool) -> str:
    """The headline of a replayed trace file (``decoded``: drawn with the family's own VQ)."""
    note = "" if decoded else " (family not loaded here: token codes shown as colours)"
    return (
        f"**{plain(trace.prompt)}** · {trace.method} · seed {trace.seed} · {plain(trace.family, 64)}{note}  \n"
        + stats_markdown(trace, None)
    )


def round_legend(counts: dict[str, int]) -> str:
    """The maps' legend with the round's counts (``viz.legend_counts``): the verdict of every
    proposed token, and re-opening as its own (striped) layer."""
    swatch = lambda name, mark="■": f'<span style="color:{viz.COLORS[name]}">{mark}</span>'  # noqa: E731
    return (
        f"{swatch('accepted')} accepted, kept **{counts['accepted_kept']}** · "
        f"{swatch('accepted', '▨')} accepted, re-opened by a neighbour **{counts['accepted_reopened']}** · "
        f"{swatch('rejected', '▨')} rejected **{counts['rejected']}** · "
        f"{swatch('reopened', '▨')} re-opened and resampled **{counts['reopened']}** · {swatch('t0')} t0 "
        f"(the round's first rejection; nothing before it is re-opened) · islands map: one colour per island "
        f"(**{counts['islands']}**), the draft faded elsewhere"
    )


def round_info(trace: Trace, index: int) -> str:
    """Round ``index`` (a valid index) of ``trace``: its counts, t0, scores, cost; then the legend."""
    rnd = trace.rounds[index]
    score = rnd.score[rnd.draft >= 0]
    counts = viz.legend_counts(rnd)
    return (
        f"{plain(viz.method_name(trace.method), 64)} · **round {index + 1} / {len(trace.rounds)}** "
        f"({plain(rnd.label, 64)}) · proposed {rnd.proposed} · accepted "
        f"{counts['accepted']} · rejected {counts['rejected']} · re-opened {counts['reopened']} "
        f"in {rnd.n_islands} island(s) · t0 = {_rc(rnd.t0, trace.grid)}"
        + (f" · score min/median {score.min():.3f}/{np.median(score):.3f}" if score.size and score.max() >= 0 else "")
        + (_tree_info(rnd.tree) if rnd.tree else "")
        + (_coupled_info(rnd.coupled) if rnd.coupled is not None else "")
        + f" · NFE target {rnd.nfe.get('target', 0)}, drafter {rnd.nfe.get('drafter', 0)}"
        + f" · {sum(rnd.timings_s.values()) * 1000:.1f} ms  \n"
        + round_legend(counts)
    )


def _tree_info(tree: dict) -> str:
    tried = sum(status != 0 for status in tree["status"])
    return f" · draft tree {len(tree['token'])} nodes, depth {max(tree['depth'], default=0)}, {tried} tried"


def _coupled_info(coupled: np.ndarray) -> str:
    return f" · coupled {int(coupled.sum())} (drafts after the commit kept for the next iteration)"


def _rc(t0, grid) -> str:
    return "none" if t0 is None else f"row {t0 // grid[1]}, col {t0 % grid[1]}"


def _score_words(method: str, score: float, tau: float) -> str:
    """What a round's score of a draft is, per method (``Round.score``)."""
    if method == "mulo":
        return f"pooled target probability {score:.3f} vs τ {tau}"
    if method in ("lantern", "lantern_chain"):
        return f"relaxed acceptance probability min(1, p̃/q) {score:.3f}"
    if method == "gsd":
        return f"group acceptance probability min(1, p(G)/q(G)) {score:.3f}"
    return f"acceptance probability {score:.3f}"


def describe_token(trace: Trace, row: int, col: int, tau: float) -> str:
    lines = [
        f"**token (row {row}, col {col})**: final code {int(trace.tokens[row, col])}, final after round "
        f"{int(viz.finalized_round(trace)[row, col]) + 1}"
    ]
    for rnd in trace.rounds:
        if rnd.draft[row, col] < 0 and not rnd.reopened[row, col] and not rnd.resampled[row, col]:
            continue
        parts = [f"round {rnd.index + 1}"]
        if rnd.draft[row, col] >= 0:
            score = float(rnd.score[row, col])
            verdict = "accepted" if rnd.accepted[row, col] else ("rejected" if rnd.rejected[row, col] else "not tested")
            test = f", {_score_words(trace.method, score, tau)}" if score >= 0 else ""
            parts.append(f"draft code {int(rnd.draft[row, col])}{test} → {verdict}")
        if rnd.reopened[row, col]:
            parts.append(f"re-opened (island {int(rnd.islands[row, col])})")
        if rnd.resampled[row, col]:
            parts.append(f"resampled in wave {int(rnd.resampled[row, col])} → code {int(rnd.tokens[row, col])}")
        if rnd.coupled is not None and rnd.coupled[row, col]:
            parts.append("kept by the coupling as the next iteration's draft")
        lines.append("- " + "; ".join(parts))
    if len(lines) == 1:
        lines.append("- decoded directly by the target (no draft for this position)")
    return "\n".join(lines)
