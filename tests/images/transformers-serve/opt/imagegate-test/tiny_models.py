"""Make a tiny random-weight Llama and its tokenizer offline (no download): usage tiny_models.py DIR.

The tokenizer is a byte-level BPE trained on a few sentences with `tokenizers`; the model is
LlamaForCausalLM with a handful of parameters; both are written with save_pretrained, so any
transformers-based server loads DIR/tiny-llama as it loads a real checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today?",
    "a tiny model answers every question",
]
# Text parts only: an image or video part is left out of the prompt (a text-only model).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: Path) -> None:
    torch.manual_seed(0)
    tok = tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.do_sample = False
    target = out / "tiny-llama"
    model.save_pretrained(target)
    tok.save_pretrained(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
