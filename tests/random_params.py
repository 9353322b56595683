"""Random parameter values for equivalence tests, drawn in numpy on a real parameter tree.

Compiling the real initialisers costs seconds per model on this CPU; the equivalence tests
need only well-scaled values, and non-trivial biases and norm scales make them stricter.
"""

import jax
import numpy as np


def fill_random(shapes, seed: int = 0, logits_scale: float = 1.0) -> dict:
    """Kernels get std 1/sqrt(fan_in), embeddings 1/sqrt(D), biases (the logits' too) 0.1;
    norm scales 1 +- 0.1.

    Args:
      shapes: the parameter tree's ShapeDtypeStructs (``jax.eval_shape`` of ``init``).
      seed: numpy seed.
      logits_scale: multiplies an untied output projection (``logits_dense``), so that a
        random model's next-token distributions are as peaked as a trained one's.

    Returns:
      A tree of float32 numpy arrays (writable, so tests can pin entries).
    """
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name, parent = path[-1].key, path[-2].key if len(path) > 1 else None
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        if name == 'scale':
            return 1.0 + 0.1 * noise
        if name in ('bias', 'logits_bias'):  # 'logits_bias': model.logits_bias's [V], top level
            return 0.1 * noise
        if name == 'embedding':
            return noise / np.sqrt(leaf.shape[1])
        fan_in = leaf.shape[0] * leaf.shape[1] if parent == 'out' else leaf.shape[0]
        scale = logits_scale if parent == 'logits_dense' else 1.0
        return scale * noise / np.sqrt(fan_in)

    return jax.tree_util.tree_map_with_path(fill, shapes)
