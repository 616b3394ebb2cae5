"""Make two tiny random-weight models and their tokenizers offline (no download): usage
tiny_models.py DIR.

- DIR/tiny-llama: LlamaForCausalLM, text only;
- DIR/tiny-vlm: Qwen2VLForConditionalGeneration (images and videos), with its processor: the
  Qwen2-VL image and video processors sized for a few patches, the tokenizer below with the
  model's vision tokens, and a chat template that places them.

The tokenizer is a byte-level BPE trained on a few sentences with `tokenizers`; every part is
written with save_pretrained, so any transformers-based server loads them as it loads a real
checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
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
# As Qwen2-VL's own template: each image or video part becomes its vision tokens, which the
# processor then repeats once per merged patch.
VLM_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% endif %}{% endfor %}",
    "{% elif c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}",
)
# 56x56 pixels at most per image or frame: 4x4 patches of 14, merged 2x2 into 4 tokens.
PIXELS = {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}


def tokenizer(extra: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL + list(extra),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(target: Path) -> None:
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
    model.save_pretrained(target)
    tok.save_pretrained(target)


def tiny_vlm(target: Path) -> None:
    tok = tokenizer(VISION)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION}
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            # head 8: 4 rotary frequencies split over time, height and width
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(target)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=PIXELS),
        video_processor=Qwen2VLVideoProcessor(size=PIXELS),
        tokenizer=tok,
        chat_template=VLM_TEMPLATE,
    )
    processor.save_pretrained(target)


def main(out: Path) -> None:
    torch.manual_seed(0)
    tiny_llama(out / "tiny-llama")
    tiny_vlm(out / "tiny-vlm")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
