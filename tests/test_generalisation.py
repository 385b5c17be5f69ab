"""The generalisation probe (``mulo.eval.generalisation``) on the toy family: AR's own samples are
never off the nucleus, a token forced outside it is counted, the plain NLL is the teacher-forced
cross-entropy, and seeds that draw different images are told apart from a memorised prompt."""

import torch

from mulo.config import GenerationConfig
from mulo.engine import Engine
from mulo.eval import generalisation
from mulo.families import toy


def engine():
    return Engine(toy.build())


def test_ar_samples_are_inside_the_nucleus_and_a_forced_token_outside_is_counted():
    eng = engine()
    config = GenerationConfig(top_p=0.5, guidance=2.0)
    result = eng.generate("red apple", "ar", 3, config.to_dict())
    scores = generalisation.token_scores(eng, "red apple", 3, result.tokens, config)
    assert scores["off_nucleus"] == 0.0 and scores["nll"] > 0 and scores["entropy"] > 0
    # the last token replaced by the code the target finds least likely there: outside top-p 0.5
    logits = generalisation.teacher_forced_logits(eng, "red apple", 3, result.tokens, config.guidance)
    forced = result.tokens.clone().reshape(-1)
    forced[-1] = int(logits[-1].argmin())
    bad = generalisation.token_scores(eng, "red apple", 3, forced.reshape(result.tokens.shape), config)
    assert bad["off_nucleus"] == 1 / forced.numel()


def test_plain_nll_is_the_teacher_forced_cross_entropy_without_guidance():
    eng = engine()
    tokens = eng.generate("cat", "ar", 0).tokens
    family = eng.family
    cond = family.condition("cat", 0)[None]
    logits = family.target(tokens.reshape(1, -1)[:, :-1], cond)[0]
    expected = float(torch.nn.functional.cross_entropy(logits, tokens.reshape(-1)))
    got = generalisation.token_scores(eng, "cat", 0, tokens, GenerationConfig(guidance=1.0))["nll"]
    assert abs(got - expected) < 1e-4


def test_seed_diversity_tells_memorised_prompts_from_varied_ones():
    same = [torch.zeros(4, 4, dtype=torch.long)] * 3
    assert generalisation.seed_diversity(same) == (0.0, 1)
    zero, one = torch.zeros(4, 4, dtype=torch.long), torch.ones(4, 4, dtype=torch.long)
    varied = [zero, one, zero]
    difference, distinct = generalisation.seed_diversity(varied)
    assert abs(difference - 2 / 3) < 1e-6 and distinct == 2
    out = generalisation.probe(engine(), ["red apple"], seeds=3, runs=[("ar", "ar", {})])
    assert out["methods"]["ar"]["off_nucleus"] == 0.0 and out["distinct_images"] == 3  # random weights vary
