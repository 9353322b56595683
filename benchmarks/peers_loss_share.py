r"""How much of the peers.py gap to torch.nn.Transformer is the benchmark's own loss.

  python benchmarks/peers_loss_share.py --preset multi30k --rounds 12

``../shared/bench/peers.py`` times one training step of torch.nn.Transformer and of this
package's model. Its torch step ends in torch's fused label-smoothed cross-entropy, while every
jax model gets the same hand-written loss (one-hot labels, ``optax.smooth_labels``,
``optax.softmax_cross_entropy``), which XLA runs as several passes over the [B, T, V] logits.
This script loads peers.py's models, batch and steps and times, in one process,

  torch / ours with peers.py's loss           exactly peers.py's two steps
  torch / ours with a linear loss             sum(logits * G) for one fixed random G [B, T, V]:
                                              the same forward, backward and Adam update,
                                              with no softmax and no label smoothing

and prints the median per-round ratio ours / torch of each pair: the first is peers.py's
figure, the second the model's own share of it. Each pair runs on its own (torch, ours,
torch, ours ...), then the next pair.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from transformer.backends import host_memory  # noqa: E402

host_memory.configure()  # as the commands do, before jax's first computation


def _load_peers(path: pathlib.Path):
    if not path.exists():
        raise SystemExit(f'{path} not found: pass --peers with the path of peers.py.')
    spec = importlib.util.spec_from_file_location('peers', path)
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    return peers


def _linear_loss_steps(peers, c, src, tgt):
    """torch and ours, each with the loss sum(logits * G) and Adam (peers.py's settings)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import torch

    from transformer.model import Transformer, TransformerConfig

    g = np.random.default_rng(1).standard_normal((c['B'], c['L'], c['V'])).astype(np.float32)
    g *= 1e-3
    torch.manual_seed(0)
    net = peers.TorchSeq2Seq(c['D'], c['N'], c['F'], c['Ne'], c['Nd'], c['V'], c['L']).train()
    adam = torch.optim.Adam(net.parameters(), lr=peers.LR)
    s, t, tg = torch.from_numpy(src).long(), torch.from_numpy(tgt).long(), torch.from_numpy(g)

    def torch_step():
        adam.zero_grad(set_to_none=True)
        loss = (net(s, t) * tg).sum()
        loss.backward()
        adam.step()
        return loss.item()

    cfg = TransformerConfig(
        vocab_size=c['V'],
        d_model=c['D'],
        num_heads=c['N'],
        d_ff=c['F'],
        num_encoder_layers=c['Ne'],
        num_decoder_layers=c['Nd'],
        dropout_rate=0.0,
        max_len=c['L'],
        attention_impl='einsum',  # the path the figures were measured on
    )
    model = Transformer(cfg)
    params = jax.jit(model.init)(jax.random.key(0), src, tgt)['params']
    tx = optax.adam(peers.LR)
    jg = jnp.asarray(g)

    def loss_fn(p, s, t, g):
        return jnp.sum(model.apply({'params': p}, s, t) * g)

    @functools.partial(jax.jit, donate_argnums=0)  # as peers.py's step
    def step(state, s, t, g):
        p, o = state
        loss, grads = jax.value_and_grad(loss_fn)(p, s, t, g)
        updates, o = tx.update(grads, o, p)
        return (optax.apply_updates(p, updates), o), loss

    state = [(params, tx.init(params))]
    js, jt = jnp.asarray(src), jnp.asarray(tgt)

    def ours_step():
        state[0], loss = step(state[0], js, jt, jg)
        return float(loss)

    return torch_step, ours_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--preset', default='multi30k', choices=('multi30k', 'base'))
    parser.add_argument('--rounds', type=int, default=12)
    parser.add_argument('--peers', default=str(REPO.parent / 'shared' / 'bench' / 'peers.py'))
    args = parser.parse_args()
    peers = _load_peers(pathlib.Path(args.peers))
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    c = peers.PRESETS[args.preset]
    src, tgt = peers.make_batch(c['V'], c['B'], c['L'])
    print(f'{args.preset} preset, {args.rounds} interleaved rounds a pair')
    # One pair at a time: a third program interleaved between them slowed both (measured up
    # to 1.3x on a 2-core host), so each pair runs alone, torch and ours in turn.
    pairs = {
        'peers loss': lambda: (peers.torch_impl(c, src, tgt)[0], peers.ours_impl(c, src, tgt)[0]),
        'linear loss': lambda: _linear_loss_steps(peers, c, src, tgt),
    }
    for loss, build in pairs.items():
        torch_step, ours_step = build()
        times = {'torch': [], 'ours': []}
        for step in (torch_step, ours_step):
            step(), step()
        for _ in range(args.rounds):
            for name, step in (('torch', torch_step), ('ours', ours_step)):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
        ratio = statistics.median(o / t for o, t in zip(times['ours'], times['torch'], strict=True))
        print(
            f'{loss:12} torch {statistics.median(times["torch"]) * 1e3:6.0f} ms, ours '
            f'{statistics.median(times["ours"]) * 1e3:6.0f} ms (medians): ours / torch '
            f'x{ratio:.3f} (median per-round ratio), load {os.getloadavg()[0]:.1f}'
        )
        del torch_step, ours_step


if __name__ == '__main__':
    main()
