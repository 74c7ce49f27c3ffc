#!/usr/bin/env python3
"""Write a tiny Llama with random weights and its own tokenizer (no downloads).

Runs inside the vLLM virtualenv (needs torch, tokenizers, transformers):

    python scripts/make_tiny_model.py --out DIR

The tokenizer is a byte-level BPE trained in about a second on seeded generated text, so every
byte string is encodable and every id from 0 to vocab_size-1 is a valid prompt token. The model
is a 2-layer Llama (hidden 128, 2 attention heads, 1 KV head, head_dim 64: vLLM's CPU attention
rejects head_dim 16) saved in bfloat16. Same seed, same files.
"""

from __future__ import annotations

import os

# One thread for the BPE trainer so that its merge order can never depend on scheduling.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

SEED = 1234
VOCAB_TARGET = 512
BOS = "<|bos|>"
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
SPECIALS = [BOS, PAD, IM_START, EOS]
ONSETS = "b c d f g h k l m n p r s t v w st tr ch sh th pl gr"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(seed: int, lines: int = 6000) -> Iterator[str]:
    """Seeded pseudo-English with digits and punctuation: enough for a few hundred merges."""
    rng = random.Random(seed)
    onsets = ["", *ONSETS.split()]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "ck"]
    words = sorted(
        {
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3))
            )
            for _ in range(900)
        }
    )
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf-like
    punct = [".", ",", "?", "!", ";", ":"]
    for _ in range(lines):
        n = rng.randint(4, 18)
        picked = rng.choices(words, weights=weights, k=n)
        if rng.random() < 0.3:
            picked.insert(rng.randrange(n), str(rng.randint(0, 9999)))
        sentence = " ".join(picked).capitalize() + rng.choice(punct)
        if rng.random() < 0.1:
            sentence = f"{IM_START}user\n{sentence}{EOS}\n"
        yield sentence


def build_tokenizer(out: Path):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(SEED), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        model_max_length=65536,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=65536,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write a tiny random-weight Llama + tokenizer")
    parser.add_argument("--out", type=Path, required=True, help="directory to (re)write")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser().resolve()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    fast = build_tokenizer(tmp)
    vocab_size = len(fast)
    ids = {t: fast.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD)}
    build_model(tmp, vocab_size, ids[BOS], ids[EOS], ids[PAD])

    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(
        f"tiny model written to {out}: vocab_size={vocab_size}, bos={ids[BOS]}, "
        f"eos={ids[EOS]}, pad={ids[PAD]}, layers=2, hidden=128, heads=2/1, head_dim=64"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
