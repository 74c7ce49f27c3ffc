#!/usr/bin/env python3
"""Set up `transformers serve` (a second real engine) beside the vLLM set-up, for its tests.

Standard library only; run it after ``scripts/setup_vllm.py`` (about 2 s):

    python scripts/setup_transformers_serve.py           # install
    python scripts/setup_transformers_serve.py --check   # ready (exit 0) or not (exit 1)

It reuses vLLM's environment (``transformers`` with its ``serve`` command, torch, FastAPI) and
tiny model, and adds under ``$LLMSPEED_VLLM_HOME/transformers-serve/`` (vLLM's environment is
left untouched):

- ``site/``   ``accelerate``, which ``transformers serve`` needs to load a model (without it:
  "Using a `device_map` ... requires `accelerate`"), installed ``--no-deps`` from the package
  index (its dependencies are all in vLLM's environment); put on ``PYTHONPATH``;
- ``model/``  the tiny model without an EOS token (links to its weights and tokenizer; a
  config and generation config without ``eos_token_id``): ``transformers serve`` rejects
  ``ignore_eos`` (HTTP 422), and the random weights draw EOS after ~16 tokens, so outputs would
  never reach their ``max_tokens``;
- ``model-words/``  the same, with an output projection (``lm_head``; the embeddings are not
  tied) that can only draw "words": tokens that decode to a space and ASCII letters and whose
  concatenations tokenize back to the same ids (checked here with ``tokenizers``). The random
  weights draw lone bytes (U+FFFD in the text, several tokens per chunk) and pieces that
  re-tokenize with other merges, so the text streamed from ``model/`` cannot be counted
  independently; the text from ``model-words/`` can (``words.json`` lists the words). Its
  other rows are zero and the words' rows come in opposite pairs (w, -w), so that at greedy
  decoding (the default: the plugin sends no temperature) the largest logit is always a word's;
- ``setup.json``  the marker.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's engines/ (stdlib only)
    sys.path.insert(0, str(ROOT))
from engines.home import TransformersServeLayout, vllm_home  # noqa: E402

ACCELERATE_SPEC = "accelerate==1.15.0"
MARKER_VERSION = 2

#: Run with vLLM's Python (torch, safetensors, tokenizers): argv = source model, target model.
#: Finds the words, checks that random concatenations of them tokenize back to their ids,
#: writes the target's model.safetensors with the output projection restricted to them, and
#: prints the words as JSON.
WORDS_MODEL = r"""
import json, random, sys
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

source, target = sys.argv[1:3]
with open(f"{source}/config.json") as f:
    assert not json.load(f).get("tie_word_embeddings"), "tied embeddings: lm_head is not its own"
tok = Tokenizer.from_file(f"{source}/tokenizer.json")
words = []
for piece, i in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
    text = " " + piece[1:]
    if piece[:1] == "\u0120" and piece[1:].isascii() and piece[1:].isalpha():
        if tok.encode(text, add_special_tokens=False).ids == [i] and tok.decode([i]) == text:
            words.append(i)
words = words[: len(words) // 2 * 2]
assert len(words) >= 16, f"only {len(words)} word tokens"
rng = random.Random(13)
for _ in range(500):
    ids = [rng.choice(words) for _ in range(rng.randrange(1, 200))]
    assert tok.encode(tok.decode(ids), add_special_tokens=False).ids == ids, ids
tensors = load_file(f"{source}/model.safetensors")
head = tensors["lm_head.weight"]
rows = torch.zeros_like(head, dtype=torch.float32)
for a, b in zip(words[0::2], words[1::2]):
    w = head[a].float()
    rows[a] = 4 * w / w.norm()
    rows[b] = -rows[a]
tensors["lm_head.weight"] = rows.to(head.dtype)
save_file(tensors, f"{target}/model.safetensors", metadata={"format": "pt"})
print(json.dumps([tok.decode([i]) for i in words]))
"""


def say(msg: str) -> None:
    print(f"[setup_transformers_serve] {msg}", flush=True)


def ready(lay: TransformersServeLayout) -> bool:
    try:
        marker = json.loads(lay.marker.read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("marker_version") == MARKER_VERSION
        and marker.get("accelerate") == ACCELERATE_SPEC
    )


def write_model(source: Path, target: Path, own: tuple[str, ...] = ()) -> None:
    """``target``: links to ``source``'s files but its configs (without ``eos_token_id``) and
    the files named in ``own`` (written by the caller)."""
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name in ("config.json", "generation_config.json", *own):
            continue
        link = target / item.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(item)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((source / name).read_text())
        config.pop("eos_token_id", None)
        (target / name).write_text(json.dumps(config, indent=2) + "\n")


def write_words_model(python: Path, source: Path, target: Path) -> list[str]:
    """``target``: the EOS-free model whose output projection draws words only."""
    write_model(source, target, own=("model.safetensors",))
    weights = target / "model.safetensors"
    if weights.is_symlink():
        weights.unlink()
    cmd = [str(python), "-c", WORDS_MODEL, str(source), str(target)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    words: list[str] = json.loads(out.strip().splitlines()[-1])
    (target.parent / "words.json").write_text(json.dumps(words, indent=1) + "\n")
    return words


def setup(lay: TransformersServeLayout) -> None:
    python, model = lay.python, lay.vllm.model
    if not (python.exists() and (model / "config.json").is_file()):
        raise SystemExit(
            f"vLLM is not set up under {lay.vllm.home}: run scripts/setup_vllm.py first"
        )
    cmd = [str(python), "-m", "pip", "install", "--no-deps", "--upgrade", "--target"]
    cmd += [str(lay.site), ACCELERATE_SPEC]
    say("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    write_model(model, lay.model)
    words = write_words_model(python, model, lay.model_words)
    say(f"model-words: {len(words)} words ({''.join(words[:8])} ...)")
    marker = {"marker_version": MARKER_VERSION, "accelerate": ACCELERATE_SPEC}
    lay.marker.write_text(json.dumps(marker, indent=2) + "\n")
    say(f"ready: {lay.home}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="say whether it is set up")
    args = parser.parse_args(argv)
    lay = TransformersServeLayout(vllm_home())
    if args.check:
        ok = ready(lay)
        say("ready" if ok else "not set up")
        return 0 if ok else 1
    if ready(lay):
        say("already set up; nothing to do")
        return 0
    setup(lay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
