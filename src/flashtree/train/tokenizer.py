"""Train the bundled byte-level BPE tokenizer and write its HF files.

Writes `tokenizer.json` (the `tokenizers` library format) and `tokenizer_config.json` with a
chat template that turns the conversation into a plain code-completion prompt.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
MASK = "<|mask|>"
SPECIALS = [EOS, MASK]
# The bundled target is a completion model: system text becomes a comment, user/assistant
# text is concatenated verbatim and the model continues it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '# ' + message['content'] + '\\n' }}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{% endfor %}"
)


def train_tokenizer(texts, vocab_size: int = 4096) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
           "mask_token": MASK, "bos_token": None, "add_bos_token": False,
           "model_max_length": 2048, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
