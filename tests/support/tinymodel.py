"""A tiny random-weight Llama, built offline, that real vLLM serves on CPU in well under a minute.

Hidden size 64 and two layers (so two pipeline stages have a layer each);
the tokenizer is a word-level one built with ``tokenizers`` from a fixed
vocabulary, with a chat template, so completions, chat and streaming all
work and nothing is downloaded.  It must be built by a Python that has
``transformers`` and ``torch`` (the vLLM environment's): ``build`` runs this
file as a script under that Python.

    python tests/support/tinymodel.py DIRECTORY
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog and then runs home to sleep in its warm bed "
         "hello world llmgw serves tiny models across nodes every rank answers").split()
SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)
BUILD_TIMEOUT_S = 300


def build(python: str, directory: Path) -> Path:
    """The tiny model in *directory*, built by *python* unless it is there already."""
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    subprocess.run([python, __file__, str(directory)], check=True, timeout=BUILD_TIMEOUT_S,
                   stdin=subprocess.DEVNULL)
    return directory


def _write(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*SPECIAL, *dict.fromkeys(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    # One head of 64: vLLM's CPU attention has no kernel for a head of 16.
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
        num_key_value_heads=1, max_position_embeddings=512, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"], tie_word_embeddings=False, torch_dtype="float32",
    )
    assert len(vocab) <= config.vocab_size
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    fast.save_pretrained(directory)


if __name__ == "__main__":
    _write(Path(sys.argv[1]))
