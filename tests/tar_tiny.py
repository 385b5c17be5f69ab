"""Tiny Tar checkpoints in the original formats, built offline for the end-to-end tests.

- LLM: a random 2-layer Qwen2 saved with ``save_pretrained`` and a word-level tokenizer built
  with ``tokenizers`` holding Qwen's chat tokens, Tar's ``<im_start>``/``<S0..2>`` and one
  ``<I…>`` token per TA-Tok code, plus a Qwen-style chat template.
- TA-Tok, AR-DTok drafter (4x4 tokens) and VQ: the golden files of ``tests/data/golden_tar``.
- AR-DTok target: a random ``llama-abs-tiny`` on an 8x8 grid (r = 2), saved as
  ``{"model": {"name", "args", "sd"}}`` exactly like the released checkpoints.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from mulo.families.tar import Paths

N_CODES = 9  # the tiny TA-Tok / AR-DTok pair: 3x3 semantic tokens
TA_TOK_CODES = 128
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<im_start>", "<im_end>", "<S0>", "<S1>", "<S2>"]
CORPUS = "system user assistant You are a helpful assistant. red apple cat rocket pizza a photo of"


def write_tokenizer(folder: Path):
    """A byte-level BPE (what Qwen2's tokenizer class rebuilds from tokenizer.json), trained in
    milliseconds on a few words, plus Tar's special and image tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    core.train_from_iterator([CORPUS] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS + [f"<I{i}>" for i in range(TA_TOK_CODES)]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_llm(folder: Path, seed: int = 0) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = write_tokenizer(folder)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    image_ids = tokenizer.convert_tokens_to_ids([f"<I{i}>" for i in range(TA_TOK_CODES)])
    with torch.no_grad():  # peaked logits that favour image tokens; the stop token stays rare
        text_rows = torch.ones(len(tokenizer), dtype=torch.bool)
        text_rows[image_ids] = False
        model.lm_head.weight.normal_(0, 1.0)
        model.lm_head.weight[text_rows] *= 0.1
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    model.save_pretrained(folder)


def write_ar_dtok(path: Path, side: int, seed: int) -> None:
    """A random tiny AR-DTok on a ``side x side`` grid, in the released checkpoint layout."""
    from mulo.models.ar_dtok import config_from_checkpoint
    from mulo.models.gpt import GPT, init_random_

    args = {"model_type": "clip_cond", "cond_dim": 48, "vocab_size": 512, "cls_token_num": N_CODES}
    args |= {"max_seq_len": side * side, "use_fixed_pe": False}
    model = init_random_(GPT(config_from_checkpoint("llama-abs-tiny", args)), seed, std=0.3)
    torch.save({"model": {"name": "llama-abs-tiny", "args": args, "sd": model.state_dict()}}, path)


def write_tiny_tar(folder: Path, golden_dir: str | Path) -> Paths:
    folder.mkdir(parents=True, exist_ok=True)
    write_llm(folder / "llm")
    for name in ("ta_tok_tiny.pth", "ar_dtok_tiny.pth", "vq_tiny.pt"):
        shutil.copy(Path(golden_dir) / name, folder / name)
    write_ar_dtok(folder / "ar_dtok_target.pth", side=8, seed=7)
    return Paths(
        llm=folder / "llm",
        ta_tok=folder / "ta_tok_tiny.pth",
        drafter=folder / "ar_dtok_tiny.pth",
        target=folder / "ar_dtok_target.pth",
        vq=folder / "vq_tiny.pt",
    )
