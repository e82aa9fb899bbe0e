"""Write a tiny random-weight llama GGUF (F16) for the real-llama.cpp tier: no download, deterministic.

usage: python make_tiny_gguf.py OUT.gguf        (needs the `gguf` and `numpy` packages)

The weights are random (seed 0), so the model writes gibberish; it exists to give a real
`llama-server` real prefill and decode work. Shape: 256 wide, 4 layers, feed-forward 768, 4 heads,
a 448-token SentencePiece-style vocabulary (3 control tokens, 256 byte-fallback tokens, printable
ASCII with and without the word-start mark): about 3.4M parameters, 7 MB. The recipe's model
(fixtures/llamacpp: 768 wide, 12 layers, 86M) made ~100 tokens/s on an idle 2-core box, but a
single token took 14-18 s at nice 10 on the same box shared with other work, so a one-token canary
read stuck; this one is ~25x less work per token. A drill keeps it busy with many long requests
instead (tests/real_llamacpp/load.py), cancelled when the drill is done.
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

WORD_START = "\u2581"


def vocabulary() -> list[tuple[str, float, int]]:
    """(text, score, token type) for every token, in id order: <unk>=0, <s>=1, </s>=2."""
    tokens = [
        ("<unk>", 0.0, gguf.TokenType.UNKNOWN),
        ("<s>", 0.0, gguf.TokenType.CONTROL),
        ("</s>", 0.0, gguf.TokenType.CONTROL),
    ]
    tokens += [(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE) for b in range(256)]
    tokens.append((WORD_START, -1.0, gguf.TokenType.NORMAL))
    for i, char in enumerate(chr(c) for c in range(33, 127)):
        tokens.append((char, -2.0 - i / 1000, gguf.TokenType.NORMAL))
        tokens.append((WORD_START + char, -1.5 - i / 1000, gguf.TokenType.NORMAL))
    return tokens


def write(out: str, embd: int = 256, layers: int = 4, ff: int = 768, heads: int = 4, ctx: int = 16384) -> None:
    """Write the model to `out`."""
    rng = np.random.default_rng(0)
    vocab = vocabulary()
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("llm-vitals-tiny-llama")
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(embd // heads)
    w.add_vocab_size(len(vocab))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list([text.encode() for text, _, _ in vocab])
    w.add_token_scores([score for _, score, _ in vocab])
    w.add_token_types([kind for _, _, kind in vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    # ChatML, so /v1/chat/completions works as well as /completion
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )

    def matrix(name: str, *shape: int) -> None:
        w.add_tensor(name, rng.normal(0, 0.02, shape).astype(np.float32).astype(np.float16))

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(embd, np.float32))  # norms stay F32, as llama.cpp expects

    matrix("token_embd.weight", len(vocab), embd)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        for part in ("q", "k", "v", "output"):
            matrix(f"blk.{i}.attn_{part}.weight", embd, embd)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", ff, embd)
        matrix(f"blk.{i}.ffn_up.weight", ff, embd)
        matrix(f"blk.{i}.ffn_down.weight", embd, ff)
    norm("output_norm.weight")
    matrix("output.weight", len(vocab), embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    write(parser.parse_args().out)


if __name__ == "__main__":
    main()
