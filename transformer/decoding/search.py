"""Which search a caller gets: the best output of greedy or beam search, by the beam size."""

from __future__ import annotations

from typing import Any

import jax

from transformer.decoding.beam import beam_search
from transformer.decoding.greedy import greedy_search
from transformer.model import Transformer

Array = jax.Array
Params = Any


def translate_batch(
    model: Transformer,
    params: Params,
    inputs: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    length_penalty: str = 'gnmt',
    max_decode_len: int | None = None,
    extra_length: int = 50,
) -> Array:
    """Best output tokens [B, T]: greedy search for ``beam_size == 1``, else beam search.

    Greedy is not beam search with one beam: that one would still weigh every EOS on its
    path by the length penalty, and here beam 1 means the cheaper plain greedy decode.
    """
    if beam_size == 1:
        return greedy_search(
            model,
            params,
            inputs,
            max_decode_len=max_decode_len,
            extra_length=extra_length,
        )
    sequences, _ = beam_search(
        model,
        params,
        inputs,
        beam_size=beam_size,
        alpha=alpha,
        length_penalty=length_penalty,
        max_decode_len=max_decode_len,
        extra_length=extra_length,
    )
    return sequences[:, 0]
