"""AR, standard speculative decoding, SJD and MC-SJD are lossless: their output follows the target exactly.

Each check compares the sequences a method samples with the target's exact sequence distribution
(Pearson chi-square, critical value at p = 0.001), and shows that the same check has power: with
a known lossy rule swapped in where the method imports the real one, the method fails it.

The target is spread out (``SPREAD_SAMPLING``: no guidance, temperature 2.5). The first version
of these tests put 96 % of the mass on one image, and even accepting 1.3x too often passed.
Chi-square values seen, critical value in brackets (the margins the sample sizes were chosen for):

    AR   real 26.2 [59.8]  temperature 2.0 instead of 2.5: 141.3  top-p 0.9 left on: 233.3
    SD   real 19.3 [42.4]  ignore q: 254.8  over-accept 1.3x: 197.5  resample from p: 281.2
    SJD  real 15.3 [64.0]  ignore q: 245.4  over-accept 1.3x: 232.0  resample from p: 207.1
    MC-SJD  real 27.4 [64.0]  coupling keeps every draft: 2807.5  over-accept 1.3x: 263.9

With the target's passes of two or more tokens in bfloat16 (``mulo.wide``: the verifications, and
here the prefill too), SD and SJD still pass against the float32 target's distribution: bf16
rounding moves the verifying distribution by less than these sample sizes can see.

    SD   bf16 verification 18.2 [42.4]   compiled bf16 layers (``mulo.fused_layers``) 20.6
    SJD  bf16 verification 19.9 [64.0]   compiled bf16 layers 18.7
"""

import pytest

from mulo import runner, wide
from mulo.methods import ar, mc_sjd, sjd, speculative
from mulo.sampling import logits_to_probs
from tests.helpers import (
    SPREAD_SAMPLING,
    accept_ignoring_q,
    accept_too_often,
    assert_spread,
    bare_family,
    chi_square,
    chi_square_critical,
    exact_sequence_distribution,
    resample_from_p,
    run_method,
    sequence_counts,
    spread_target,
    tiny_gpt,
)

pytestmark = pytest.mark.slow  # chi-square tests over thousands of sequences: ~3 min together

TARGET, COND = spread_target()
DRAFTER = tiny_gpt(52, 3, 2, std=1.6)  # far from the target, so how a draft is accepted matters


@pytest.fixture(scope="module")
def p_target():
    _, p = exact_sequence_distribution(TARGET, COND, SPREAD_SAMPLING["cfg"], SPREAD_SAMPLING["temperature"])
    return p


def _chi_square_and_critical(counts, p_target):
    stat, dof = chi_square(counts, p_target)
    return stat, chi_square_critical(dof)


# The lossy stand-ins for mulo.sampling's rules, by the name a method imports the real one under.
LOSSY_RULES = {
    "ignore-q": ("speculative_accept", accept_ignoring_q),
    "over-accept": ("speculative_accept", accept_too_often),
    "resample-from-p": ("residual_distribution", resample_from_p),
}

# -- standard speculative decoding ------------------------------------------------------------------

SD_SAMPLES = 600
SD_KNOBS = dict(SPREAD_SAMPLING, draft_len=3)


def _sd_counts():
    return sequence_counts(speculative.generate, bare_family(TARGET, DRAFTER), COND, SD_SAMPLES, **SD_KNOBS)


def test_sd_matches_the_target_sequence_distribution(p_target):
    assert_spread(p_target, SD_SAMPLES)
    stat, critical = _chi_square_and_critical(_sd_counts(), p_target)
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize("bug", LOSSY_RULES)
def test_sd_check_rejects_a_lossy_verification(bug, p_target, monkeypatch):
    seam, lossy = LOSSY_RULES[bug]
    monkeypatch.setattr(speculative, seam, lossy)
    stat, critical = _chi_square_and_critical(_sd_counts(), p_target)
    assert stat > critical, (bug, stat, critical)


# -- SJD -----------------------------------------------------------------------------------------------
# SJD's drafts come in two kinds. A fresh random guess has a one-hot q: for it "ignore q" is the
# real rule, and "resample from p" is lossless too (a uniform guess accepted with p(x), else a draw
# from p, gives p). Both bugs show only on the other kind: a draft sampled from p in an earlier
# iteration (q = that p) whose context has changed since, because a draft before it was rejected.
# A window over the whole image starts every run with random guesses whose rejections leave such
# stale drafts behind, and this target's next token depends strongly on the previous one, so
# their q is far from p. The effects per image are still small: hence the larger sample.

SJD_SAMPLES = 2000
SJD_KNOBS = dict(SPREAD_SAMPLING, sjd_window=4)


def _sjd_counts():
    return sequence_counts(sjd.generate, bare_family(TARGET), COND, SJD_SAMPLES, **SJD_KNOBS)


def test_sjd_matches_the_target_sequence_distribution(p_target):
    assert_spread(p_target, SJD_SAMPLES)
    stat, critical = _chi_square_and_critical(_sjd_counts(), p_target)
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize("bug", LOSSY_RULES)
def test_sjd_check_rejects_a_lossy_verification(bug, p_target, monkeypatch):
    seam, lossy = LOSSY_RULES[bug]
    monkeypatch.setattr(sjd, seam, lossy)
    stat, critical = _chi_square_and_critical(_sjd_counts(), p_target)
    assert stat > critical, (bug, stat, critical)


# -- MC-SJD ---------------------------------------------------------------------------------------------
# MC-SJD's drafts after the first rejection are not drawn afresh but coupled with the current ones:
# a draft stays when it passes its test, else it is redrawn from the residual, so it follows the
# target's latest p all the same and the next verification (q = p) stays exact. The check runs SJD's
# setting (a 4-token window over the 2x2 image, so every run couples drafts) and shows its power
# on the coupling itself and on the coin the coupling shares with the verification.


def coupling_keeps_every_draft(drafts, qs, p, passed, generator):
    """Bug: the coupling forgets its test: every draft stays, claimed to follow p (so q = p)."""
    return drafts.clone(), p


MC_SJD_SAMPLES = 2000
BROKEN_COUPLING = {
    "coupling-keeps-every-draft": ("couple", coupling_keeps_every_draft),
    "over-accept": ("speculative_accept", accept_too_often),  # the coin the verification and coupling share
}


def _mc_sjd_counts():
    return sequence_counts(mc_sjd.generate, bare_family(TARGET), COND, MC_SJD_SAMPLES, **SJD_KNOBS)


@pytest.mark.slow
def test_mc_sjd_matches_the_target_sequence_distribution(p_target):
    """chi-square 27.4 against the critical 64.0 (seeds 0..1999)."""
    assert_spread(p_target, MC_SJD_SAMPLES)
    stat, critical = _chi_square_and_critical(_mc_sjd_counts(), p_target)
    assert stat < critical, (stat, critical)


@pytest.mark.slow
@pytest.mark.parametrize("bug", BROKEN_COUPLING)
def test_mc_sjd_check_rejects_a_broken_coupling(bug, p_target, monkeypatch):
    """The same check with the coupling broken on purpose reached chi-square 2807.5 (every draft
    kept) and 263.9 (a coin that accepts 1.3x too often), against the critical 64.0."""
    seam, lossy = BROKEN_COUPLING[bug]
    monkeypatch.setattr(mc_sjd, seam, lossy)
    stat, critical = _chi_square_and_critical(_mc_sjd_counts(), p_target)
    assert stat > critical, (bug, stat, critical)


# -- AR --------------------------------------------------------------------------------------------------
# AR has no acceptance rule to get wrong; its lossy variants sample from a slightly wrong
# distribution, swapped in where the runner turns logits into probabilities for every method.

AR_SAMPLES = 1500


def probs_at_temperature_2(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Bug: temperature 2.0 whatever the request asks (2.5 here)."""
    return logits_to_probs(logits, 2.0, top_k, top_p)


def probs_with_top_p_on(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Bug: top-p 0.9 although the request leaves top-p off."""
    return logits_to_probs(logits, temperature, top_k, 0.9)


LOSSY_SAMPLING = {"temperature-2.0": probs_at_temperature_2, "top-p-0.9": probs_with_top_p_on}


def _ar_counts():
    return sequence_counts(ar.generate, bare_family(TARGET), COND, AR_SAMPLES, **SPREAD_SAMPLING)


def test_ar_matches_the_target_sequence_distribution(p_target):
    assert_spread(p_target, AR_SAMPLES)
    stat, critical = _chi_square_and_critical(_ar_counts(), p_target)
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize("bug", LOSSY_SAMPLING)
def test_ar_check_rejects_a_wrong_sampling_distribution(bug, p_target, monkeypatch):
    monkeypatch.setattr(runner, "logits_to_probs", LOSSY_SAMPLING[bug])
    stat, critical = _chi_square_and_critical(_ar_counts(), p_target)
    assert stat > critical, (bug, stat, critical)


# -- with bf16 verification (mulo.wide) ----------------------------------------------------------------


@pytest.fixture(params=["autocast", "compiled"])
def bf16_verification(p_target, request):  # p_target first: the distribution tested against is the float32 one
    """The target's passes in bf16 as each bf16 path runs them: under autocast, and with the layers
    compiled (``mulo.fused_layers``, the engine's path on CPUs with bf16 matrix units)."""
    wide.attach([TARGET], "bfloat16", min_width=2, fused=request.param == "compiled")
    yield request.param
    TARGET.wide = None


def _assert_target_passes_in_bf16(fn, family, **knobs):
    _, _, ctx = run_method(fn, family, COND, 0, **knobs)
    assert ctx.precisions()["target"].get("bfloat16", 0) >= 2  # the prefill and a verification at least
    return TARGET.wide.layers


@pytest.mark.slow
def test_sd_with_bf16_verification_matches_the_target_sequence_distribution(p_target, bf16_verification):
    layers = _assert_target_passes_in_bf16(speculative.generate, bare_family(TARGET, DRAFTER), **SD_KNOBS)
    assert layers == bf16_verification
    stat, critical = _chi_square_and_critical(_sd_counts(), p_target)
    assert stat < critical, (stat, critical)


@pytest.mark.slow
def test_sjd_with_bf16_verification_matches_the_target_sequence_distribution(p_target, bf16_verification):
    layers = _assert_target_passes_in_bf16(sjd.generate, bare_family(TARGET), **SJD_KNOBS)
    assert layers == bf16_verification
    stat, critical = _chi_square_and_critical(_sjd_counts(), p_target)
    assert stat < critical, (stat, critical)
