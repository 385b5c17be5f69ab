"""The tar family end to end on tiny checkpoints in the original formats (no network)."""

from __future__ import annotations

import os
import re
import time

import pytest
import torch

from mulo.engine import Engine
from mulo.families import tar
from mulo.families.base import Family
from mulo.models.ar_dtok import load_ar_dtok
from mulo.models.ta_tok import load_ta_tok
from mulo.models.vq16 import load_vq16
from tests.helpers import run_cli
from tests.tar_tiny import N_CODES, write_tiny_tar


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory, golden_dir):
    return write_tiny_tar(tmp_path_factory.mktemp("tar"), golden_dir)


@pytest.fixture(scope="module")
def engine(tiny_paths):
    return Engine(tar.build_from_paths(tiny_paths, ratio=2, n_codes=N_CODES))


def test_llm_codes_are_the_image_tokens_of_the_sampled_text(engine):
    """What Tar does with a regex over the decoded text, we do with a vocabulary table."""
    llm = engine.family.conditioner.llm
    ids = llm.sample_ids("red apple", torch.Generator().manual_seed(3))
    text = llm.tokenizer.decode(ids)
    from_text = [int(x) for x in re.findall(r"<I(\d+)>", text)]
    expected = (from_text + [0] * N_CODES)[:N_CODES]
    assert llm.codes_from_ids(ids).tolist() == expected
    assert len(from_text) >= N_CODES // 2  # the tiny LLM mostly writes image tokens
    prompt_text = llm.tokenizer.decode(llm.prompt_ids("red apple")[0])
    assert prompt_text.endswith("<im_start> <S0>") or prompt_text.endswith("<im_start><S0>")
    assert "<|im_start|> user" in prompt_text or "<|im_start|>user" in prompt_text


@pytest.mark.parametrize("method", ["ar", "mulo"])
def test_tiny_pipeline_end_to_end(engine, method):
    result = engine.generate("red apple", method=method, seed=1)
    assert result.tokens.shape == (8, 8)
    assert result.image.shape == (128, 128, 3) and result.image.dtype.name == "uint8"
    trace = result.trace
    assert trace.family == "tar" and trace.timings_s["condition"] > 0
    if method == "ar":
        assert trace.nfe["target"] == 64 and trace.nfe["drafter"] == 0
    else:
        assert trace.nfe["drafter"] == 16 and len(trace.rounds) >= 1
    again = engine.generate("red apple", method=method, seed=1)
    assert torch.equal(again.tokens, result.tokens)  # reproducible from the seed, LLM included


def test_eagle2_on_tar_is_a_clear_error_naming_why(engine):
    from mulo.config import ConfigError

    with pytest.raises(ConfigError, match="no EAGLE head exists for Tar's AR-DTok"):
        engine.generate("red apple", method="eagle2", seed=0)
    assert engine.generate("red apple", method="ar", seed=0).tokens.shape == engine.family.grid


def test_seed_changes_the_semantic_tokens(engine):
    cond = engine.family.conditioner
    a, b = cond("red apple", 0), cond("red apple", 1)
    assert a.shape == (N_CODES, 48) and not torch.equal(a, b)
    assert torch.equal(a, cond("red apple", 0))


def test_mulo_with_tau_zero_accepts_every_draft(engine):
    """tau = 0 accepts every up-sampled draft token: one verification pass, no resampling."""
    trace = engine.generate("cat", method="mulo", seed=2, config={"tau": 0.0}).trace
    assert trace.summary()["acceptance_rate"] == 1.0


def test_golden_end_to_end_chain(golden_dir):
    """Tar's decode_from_encoder_indices on the tiny models: TA-Tok features, AR-DTok tokens
    (same per-request random stream as the reference's seeded global one), VQ image."""
    ref = torch.load(os.path.join(golden_dir, "e2e_tiny_ref.pt"), weights_only=True)
    ta_tok = load_ta_tok(os.path.join(golden_dir, "ta_tok_tiny.pth"))
    features = ta_tok.decode(ref["ta_tok_indices"])
    torch.testing.assert_close(features, ref["ta_tok_features"], atol=1e-4, rtol=1e-4)

    class Fixed:  # the LLM stage is not part of the reference: feed its indices' features
        def check(self, prompt):
            pass

        def ignored(self, prompt):
            return []

        def alias(self, prompt):
            return None

        def __call__(self, prompt, seed=0):
            return features[0]

    ar = load_ar_dtok(os.path.join(golden_dir, "ar_dtok_tiny.pth"))
    family = Family("tar", ar, {}, load_vq16(os.path.join(golden_dir, "vq_tiny.pt")), Fixed())
    config = {"cfg": float(ref["cfg_scale"]), "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    result = Engine(family).generate("golden", method="ar", seed=int(ref["seed"]), config=config)
    assert result.tokens.reshape(-1).tolist() == ref["ar_tokens"][0].long().tolist()
    pixels = family.vq.decode(result.tokens[None])  # clamped to [0, 1], as Tar's post-processing
    torch.testing.assert_close(pixels, ref["vq_float_image"].clamp(0, 1), atol=1e-4, rtol=1e-4)
    # Tar truncates to uint8, we round: at most one step apart.
    diff = (torch.from_numpy(result.image).int() - ref["image_uint8"][0].int()).abs()
    assert int(diff.max()) <= 1


def test_variant_names():
    assert tar.parse_variant("tar") == tar.Variant("1.5b", 512)
    assert tar.parse_variant("tar-7b-1024") == tar.Variant("7b", 1024)
    assert tar.parse_variant("tar-1024").ratio == 4
    with pytest.raises(ValueError, match="unknown tar variant"):
        tar.parse_variant("tar-13b")
    # the family registry: every variant by its name, "tar-1.5b-512" as another name of "tar"
    from mulo import families

    assert {"tar", "tar-1.5b-1024", "tar-7b-512", "tar-7b-1024"} <= set(families.names())
    assert families.get("tar-1.5b-512") is families.get("tar") and "tar-1.5b-512" not in families.names()
    with pytest.raises(ValueError, match="family must be one of"):
        families.get("tar-13b")


def test_missing_weights_name_every_file_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(tar.MissingWeights) as info:
        tar.locate(tar.Variant("7b", 1024))
    message = str(info.value)
    for name in ("csuhan/Tar-7B-v0.1", "ta_tok.pth", "ar_dtok_lp_256px.pth", "ar_dtok_lp_1024px.pth", "vq_ds16_t2i.pt"):
        assert name in message
    assert "python -m mulo download tar --llm 7b --res 1024" in message


def offline_cache(folder) -> dict:
    return {"HF_HUB_CACHE": str(folder), "HF_HUB_OFFLINE": "1"}


def test_cli_without_weights_fails_fast_with_one_line(tmp_path):
    start = time.perf_counter()
    proc = run_cli("generate", "--family", "tar", "--prompt", "a red apple", env=offline_cache(tmp_path))
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tar weights are not in the Hugging Face cache")
    assert "python -m mulo download tar --llm 1.5b --res 512" in lines[0]
    # It answers before loading or fetching any weights (either would take minutes); the bound
    # leaves room for cold imports of torch, transformers and diffusers (16.8 s in a clean-clone CI).
    assert elapsed < 60


def test_download_without_network_is_one_clear_line(tmp_path):
    proc = run_cli("download", "tar", "--llm", "7b", "--res", "1024", env=offline_cache(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: downloading tar-7b-1024 from the Hugging Face Hub failed")
