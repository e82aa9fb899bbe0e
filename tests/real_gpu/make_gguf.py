"""Write the GPU tier's model: the llama.cpp tier's random-weight llama GGUF, at 824M parameters (F16, 1.6 GB).

usage: PYTHONPATH=tests python tests/real_gpu/make_gguf.py OUT.gguf      (needs `gguf` and `numpy`)

The writer is tests/real_llamacpp/make_tiny_gguf.py (random weights, seed 0, no download); only the
shape differs: the one the earlier H200 run used (tests/fixtures/gpu/README.md), 2048 wide, 16
layers, feed-forward 5632, 16 heads. Big enough that the GPU does real work per token (4 slots of
it held 4.5 GB and drew 237 W on the H200), small enough to write in ~20 s and load in ~1 s.
"""

from __future__ import annotations

import sys

EMBD, LAYERS, FF, HEADS = 2048, 16, 5632, 16
VOCAB = 448  # make_tiny_gguf.vocabulary(): 3 control, 256 byte and 189 printable-ASCII tokens


def parameter_count(embd: int = EMBD, layers: int = LAYERS, ff: int = FF, vocab: int = VOCAB) -> int:
    """The model's parameters: embeddings and output, then per layer attention (4 x embd^2), feed-forward (3 x embd x ff), norms."""
    per_layer = 4 * embd * embd + 3 * embd * ff + 2 * embd
    return 2 * vocab * embd + layers * per_layer + embd


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.splitlines()[2])
    from real_llamacpp.make_tiny_gguf import write  # needs gguf and numpy: imported only to write

    write(sys.argv[1], embd=EMBD, layers=LAYERS, ff=FF, heads=HEADS)
    print(f"wrote {sys.argv[1]}: {parameter_count() / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
