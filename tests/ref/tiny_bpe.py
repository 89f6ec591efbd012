"""The small byte-level BPE tokenizer the generation checks train (HF `tokenizers`, no download):
a Qwen2-style split pattern and byte map over 500 random sentences of nine words, vocabulary 300.
Shared by tests/ref/generate_parity.py (CI) and scripts/gpu_generate_parity.py (the GPU check);
standard library and `tokenizers` only, as the GPU image may lack numpy."""

import random


def train_tiny_bpe(special_tokens):
    """A trained tokenizers.Tokenizer with `special_tokens` first in its vocabulary."""
    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
    rng = random.Random(0)
    words = ["the", "fox", "said", "hello", "answer", "question", "world", "assistant", "brief"]
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s?\p{L}+|\s?\p{N}|\s?[^\s\p{L}\p{N}]+|\s+"),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok
