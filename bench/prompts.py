"""Prompts for a bench: fixed by a seed, so two runs (base and speculative) send exactly the same text.

Lengths are in words, an approximation of tokens (about 1.3 tokens per English word for common
tokenizers); the server's `usage` says how many tokens the prompt really had."""

from __future__ import annotations

import random

# Common words, so the prompt tokenizes like text and not like noise (noise inflates the token count).
_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more other what time up about into "
    "than them can only new some could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since against go came "
    "right used take three place small found part home house water light river city number story system order"
)
_WORDS = tuple(_TEXT.split())


def make_prompts(count: int, words: int, seed: int) -> list[str]:
    """`count` prompts of `words` words each, the same for the same seed on every machine."""
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        body = " ".join(rng.choice(_WORDS) for _ in range(max(1, words - 3)))
        prompts.append(f"Request {index}: {body}. Continue:")
    return prompts
