"""The label-smoothed cross-entropy fused with the output projection, a chunk of tokens at a time.

The full-logits loss (transformer/training/steps.py) forms the float32 [B, T, V] logits, then
their gradient, each the batch's tokens times the vocabulary (26.6k tokens x 37k x 4 bytes =
3.9 GB for a WMT step), and reads and writes them several times. Following Cut Cross-Entropy
(Wijmans et al., 2024, "Cut Your Losses in Large-Vocabulary Language Models") and Liger
Kernel's fused linear cross-entropy (Hsu et al., 2024), `fused_cross_entropy` takes the
decoder's last hidden states y [B, T, D] and the projection W [V, D] instead and walks over
chunks of C tokens (the same positions of every row): the chunk's logits z = y_c W^T (+ b)
[C, V], its loss sums, and, when a gradient is wanted, its dz = softmax(z) - q (Sec. 5.4's
smoothed target q), dy_c = dz W and the running dW += dz^T y_c, all before the next chunk.
Only [C, V] blocks ever exist.

As in Liger, the gradient is computed in the forward pass of the differentiated function (the
loss is a scalar whose cotangent only scales it), so each chunk's logits are multiplied out once
and the output layer costs the same three products as the full-logits path; CCE instead
recomputes them in the backward pass (four). The NLL and the correct count come out with
`stop_gradient`: only the smoothed loss is differentiable, the one the step differentiates.
Without differentiation (evaluation) only the forward sums run.

W and b are the model's output head's, and each chunk's logits are computed by its one rule
(`output_logits`, transformer/model/output_head.py), as the model's forward pass computes them:
the product in the model's compute dtype (bfloat16 logits as `Transformer.decode` makes them);
the softmax statistics, dz and the dW accumulation are float32.

The loss reads the logits through one float32 copy (for 16-bit logits a second [tokens, V]
array): reading them in their own dtype with float32 sums instead measured no faster on an H200
(docs/experiments.md, "Removed options").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer import backends
from transformer.model import output_logits

Array = jax.Array


def smoothing_weights(vocab: int, label_smoothing: float) -> tuple[float, float]:
    """(confidence - low, low) of the smoothed target over ``vocab`` tokens (Sec. 5.4)."""
    low = label_smoothing / (vocab - 1)
    return 1.0 - label_smoothing - low, low


def token_losses(z: Array, targets: Array, label_smoothing: float) -> tuple[Array, Array, Array]:
    """(smoothed loss, NLL, logsumexp) of every position of float32 logits z [..., V].

    With the smoothed target q = low + (conf - low) * onehot, whose entries sum to 1, and
    log p = z - logsumexp(z): -sum_v q_v log p_v = lse - (conf - low) z_target - low sum_v z_v.
    Only logsumexp, the target logit and the logits' sum are needed, never the log of a
    probability, so it is finite for any finite logits.
    """
    on_target, low = smoothing_weights(z.shape[-1], label_smoothing)
    lse = jax.nn.logsumexp(z, axis=-1)
    target_logit = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
    smoothed = lse - on_target * target_logit - low * z.sum(axis=-1)
    return smoothed, lse - target_logit, lse


def logits_grad(
    logits: Array,
    targets: Array,
    lse: Array,
    g_smoothed: Array,
    g_nll: Array,
    label_smoothing: float,
    g_lse: Array | None = None,
) -> Array:
    """d/dz of g_smoothed * smoothed + g_nll * NLL (+ g_lse * logsumexp): (g_s + g_n (+
    g_lse)) softmax(z) - g_s q_low - one-hot terms, computed in float32 and written once in
    the logits' dtype."""
    on_target, low = smoothing_weights(logits.shape[-1], label_smoothing)
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    is_target = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    on_probs = g_smoothed + g_nll if g_lse is None else g_smoothed + g_nll + g_lse
    grad = (
        on_probs[..., None] * probs
        - (low * g_smoothed)[..., None]
        - jnp.where(is_target, (on_target * g_smoothed + g_nll)[..., None], 0.0)
    )
    return grad.astype(logits.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def position_losses(logits: Array, targets: Array, label_smoothing: float, z_loss: float = 0.0):
    """[...] smoothed and plain cross-entropy of every position of ``logits`` [..., V]
    (`token_losses` of a float32 copy), and with ``z_loss`` = C > 0 a third output, the
    z-loss C log(Z)^2 of each position (PaLM, Chowdhery et al., 2022: Z the softmax's
    normaliser, so log Z = logsumexp(z)). The gradient is written out, d/dz = softmax(z) - q
    (times each output's cotangent, `logits_grad`; the z-loss's is 2 C log(Z) softmax(z)):
    one pass over the logits, where autodiff through log_softmax made several and
    materialised the log-probabilities (docs/experiments.md)."""
    return _position_fwd(logits, targets, label_smoothing, z_loss)[0]


def _position_fwd(logits, targets, label_smoothing, z_loss):
    smoothed, nll, lse = token_losses(logits.astype(jnp.float32), targets, label_smoothing)
    if not z_loss:
        return (smoothed, nll), (logits, targets, lse)
    return (smoothed, nll, z_loss * jnp.square(lse)), (logits, targets, lse)


def _position_bwd(label_smoothing, z_loss, residuals, cotangents):
    logits, targets, lse = residuals
    g_lse = None if not z_loss else cotangents[2] * 2.0 * z_loss * lse
    g_smoothed, g_nll = cotangents[:2]
    return logits_grad(logits, targets, lse, g_smoothed, g_nll, label_smoothing, g_lse), None


position_losses.defvjp(_position_fwd, _position_bwd)


def fused_cross_entropy(
    hidden: Array,
    weight: Array,
    bias: Array | None,
    targets: Array,
    weights: Array,
    label_smoothing: float,
    chunk_tokens: int,
    dtype,
    z_loss: float = 0.0,
) -> tuple[Array, ...]:
    """Summed smoothed loss, NLL and correct count of logits ``hidden @ weight.T + bias``
    (with ``z_loss`` = C > 0: the smoothed loss plus the z-loss C log(Z)^2, and that z-loss
    alone as a fourth sum).


    The same sums as `steps.cross_entropy_with_smoothing` and the argmax accuracy over the
    full logits, without forming them (module docstring).

    Args:
      hidden: [B, T, D] decoder hidden states (`Transformer` called with ``logits=False``).
      weight: [V, D] output projection (`Transformer.output_projection`).
      bias: [V] or None.
      targets: [B, T] token ids.
      weights: [B, T], 1 for real target tokens, 0 for padding.
      label_smoothing: eps_ls.
      chunk_tokens: tokens per chunk. A chunk holds the same positions of every row (so that
        rows sharded over devices stay where they are): chunk_tokens // B of them, at least
        one; the last chunk is padded with weight-0 positions.
      dtype: compute dtype of the product (the model's ``dtype``).
      z_loss: C of the z-loss (`position_losses`); 0: none.

    Returns:
      (smoothed loss sum, NLL sum, correct count), float32 scalars; only the first carries a
      gradient (to ``hidden``, ``weight`` and ``bias``). With ``z_loss``: (smoothed loss +
      z-loss sum, NLL sum, correct count, z-loss sum), the first the objective whose gradient
      it carries.
    """
    if chunk_tokens < 1:
        raise ValueError(f'chunk_tokens must be >= 1, got {chunk_tokens}.')
    sums = _fused(
        hidden,
        weight,
        bias,
        targets,
        weights.astype(jnp.float32),
        float(label_smoothing),
        int(chunk_tokens),
        jnp.dtype(dtype),
        float(z_loss),
    )
    return (sums[0], *(jax.lax.stop_gradient(x) for x in sums[1:]))


def _chunks(x: Array, size: int) -> Array:
    """[B, T, ...] -> [K, B * size, ...]: chunk k holds positions [k size, (k + 1) size) of
    every row, T padded with zeros to a multiple of ``size``."""
    x = jnp.pad(x, [(0, 0), (0, -x.shape[1] % size)] + [(0, 0)] * (x.ndim - 2))
    x = jnp.swapaxes(x.reshape(x.shape[0], -1, size, *x.shape[2:]), 0, 1)  # [K, B, size, ...]
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _sweep(y, weight, bias, targets, weights, label_smoothing, chunk_tokens, dtype, z_loss, grads):
    """The loop over chunks: sums [3] ([4] with ``z_loss``: the first then includes it) and,
    with ``grads``, (dy [B, T, D], dW [V, D], db [V])."""
    rows, length, d = y.shape
    on_target, low = smoothing_weights(weight.shape[0], label_smoothing)
    size = max(1, min(chunk_tokens // rows, length))
    w = weight.astype(dtype)
    b = None if bias is None else bias.astype(dtype)
    xs = (_chunks(y.astype(dtype), size), _chunks(targets, size), _chunks(weights, size))

    def body(carry, chunk):
        y_c, t_c, wt_c = chunk
        z = output_logits(y_c[None], w, b, dtype)[0]  # [C, V], as the model's forward
        smoothed, nll, lse = token_losses(z, t_c, label_smoothing)
        correct = (z.argmax(-1) == t_c).astype(jnp.float32)
        per_token = [smoothed, nll, correct]
        if z_loss:
            z_term = z_loss * jnp.square(lse)
            per_token = [smoothed + z_term, nll, correct, z_term]
        sums = (jnp.stack(per_token) * wt_c).sum(-1)
        if not grads:
            return carry + sums, None
        is_target = t_c[:, None] == jnp.arange(z.shape[-1], dtype=t_c.dtype)
        probs = jnp.exp(z - lse[:, None])
        if z_loss:  # d/dz C log(Z)^2 = 2 C log(Z) softmax(z)
            probs = probs * (1.0 + 2.0 * z_loss * lse[:, None])
        dz = probs - low - jnp.where(is_target, on_target, 0.0)
        dz = (dz * wt_c[:, None]).astype(dtype)
        dy_c = backends.einsum('CV,VD->CD', dz, w)
        # dW^T = y^T dz keeps the [C, V] block in place (see backends/logits_layout.py).
        dwt = jnp.einsum('CD,CV->DV', y_c, dz, preferred_element_type=jnp.float32)
        db = None if b is None else dz.astype(jnp.float32).sum(0)
        total, dwt_total, db_total = carry
        add_db = None if b is None else db_total + db
        return (total + sums, dwt_total + dwt, add_db), dy_c

    zeros = jnp.zeros((4 if z_loss else 3,), jnp.float32)
    if not grads:
        return jax.lax.scan(body, zeros, xs)[0], None
    init = (zeros, jnp.zeros((d, w.shape[0]), jnp.float32), None)
    if b is not None:
        init = (zeros, init[1], jnp.zeros(w.shape[:1], jnp.float32))
    (sums, dwt, db), dy = jax.lax.scan(body, init, xs)
    dy = jnp.swapaxes(dy.reshape(dy.shape[0], rows, size, d), 0, 1)  # [B, K, size, D]
    dy = dy.reshape(rows, -1, d)[:, :length].astype(y.dtype)
    db = None if bias is None else db.astype(bias.dtype)
    return sums, (dy, dwt.T.astype(weight.dtype), db)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(y, weight, bias, targets, weights, label_smoothing, chunk_tokens, dtype, z_loss):
    """[3] sums (smoothed, NLL, correct; [4] with the z-loss); the gradient only follows the
    first (see `fused_cross_entropy`, which stops the others)."""
    options = (label_smoothing, chunk_tokens, dtype, z_loss)
    return _sweep(y, weight, bias, targets, weights, *options, False)[0]


def _fused_fwd(y, weight, bias, targets, weights, label_smoothing, chunk_tokens, dtype, z_loss):
    # The residuals are the gradients themselves, for a cotangent of 1 (module docstring).
    options = (label_smoothing, chunk_tokens, dtype, z_loss)
    return _sweep(y, weight, bias, targets, weights, *options, True)


def _fused_bwd(label_smoothing, chunk_tokens, dtype, z_loss, grads, g):
    scale = g[0]  # the smoothed loss's cotangent; the others are stopped (fused_cross_entropy)
    dy, dw, db = (None if x is None else x * scale.astype(x.dtype) for x in grads)
    return dy, dw, db, None, None


_fused.defvjp(_fused_fwd, _fused_bwd)
