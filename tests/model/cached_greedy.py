"""Greedy decoding step by step on both sides, for the families' tests against Hugging Face
(tests/model/test_fairseq_families.py, test_t5_family.py): transformers' ``generate`` with
nothing forced and no end, and our decoding steps with the key/value cache fed each step's
argmax. Each returns (tokens [B, steps], each step's scores [B, steps, V])."""

import jax
import numpy as np

from transformer.model import Transformer, TransformerConfig, decode_step, encode, init_cache


def hf_greedy(model, inputs: np.ndarray, pad: int, steps: int, **flags):
    """``model.generate(num_beams=1)`` of ``inputs`` (padded with ``pad``, masked) for exactly
    ``steps`` tokens (no end), its scores the logits of each step; ``flags`` add to
    generate's (a family's start token, its forced tokens turned off)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.from_numpy(inputs).long(),
            attention_mask=torch.from_numpy(inputs != pad).long(),
            num_beams=1,
            do_sample=False,
            max_new_tokens=steps,
            min_new_tokens=0,
            eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
            **flags,
        )
    return out.sequences.numpy()[:, 1:], np.stack([s.numpy() for s in out.scores], axis=1)


def cached_greedy(cfg: TransformerConfig, params, inputs: np.ndarray, steps: int):
    """Our `decode_step` ``steps`` times from ``cfg.special.decoder_start``, each step fed the
    previous one's argmax, in float32 products; its scores the logits of each step."""
    ours = Transformer(cfg)
    step = jax.jit(decode_step, static_argnums=0)
    with jax.default_matmul_precision('float32'):
        encoded = jax.jit(encode, static_argnums=0)(ours, params, inputs)
        cache = jax.jit(init_cache, static_argnums=(0, 4))(ours, params, encoded, inputs, steps)
        previous = np.full((inputs.shape[0],), cfg.special.decoder_start, np.int32)
        tokens, scores = [], []
        for _ in range(steps):
            logits, cache = step(ours, params, cache, encoded, inputs, previous)
            scores.append(np.asarray(logits))
            previous = np.argmax(scores[-1], axis=-1).astype(np.int32)
            tokens.append(previous)
    return np.stack(tokens, axis=1), np.stack(scores, axis=1)
