"""The collectives one decoding step runs on a mesh, per parameter layout, counted in the
compiled program (nothing runs: the searches are lowered on abstract, sharded parameters).

    python benchmarks/decode_collectives.py [--devices 8] [--out FILE.json]

On 8 host CPU devices (the flag below is set before jax loads) unless ``--devices`` names
fewer. For each layout (data only, FSDP, FSDP with ``gather_params``, a model axis of 2) and
each search (greedy, beam 4) it compiles the search of 64 sentences x 32 source tokens for the
base model's shapes (2 layers each side) and counts, in the decoding loop over the full batch
(its condition and body, with the computations they call: one step), the all-gather,
all-reduce, reduce-scatter, all-to-all and collective-permute instructions. docs/parallelism.md
holds the table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KINDS = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all', 'collective-permute')


def _computations(hlo: str) -> dict[str, str]:
    """Computation name -> its text, from a compiled module's HLO text."""
    found, name, lines = {}, None, []
    for line in hlo.splitlines():
        header = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
        if header and not line.startswith(' '):
            name, lines = header.group(1), []
        elif line.startswith('}') and name:
            found[name] = '\n'.join(lines)
            name = None
        elif name:
            lines.append(line)
    return found


def _called(text: str) -> list[str]:
    names = re.findall(r'(?:calls|body|condition|to_apply)=%?([\w.\-]+)', text)
    for group in re.findall(r'branch_computations=\{([^}]*)\}', text):
        names += [n.strip().lstrip('%') for n in group.split(',')]
    return names


def _count(name: str, computations: dict[str, str], seen: set) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    if name in seen or name not in computations:
        return counts
    seen.add(name)
    text = computations[name]
    for kind in KINDS:
        # An async collective is a -start / -done pair: counted once, by its start.
        counts[kind] += len(re.findall(rf'= \S+ {kind}(?:-start)?\(', text))
    for called in _called(text):
        counts += _count(called, computations, seen)
    return counts


def _state_size(state: str) -> int:
    """Elements in a while loop's state type (``(s32[], f32[64,16]{1,0}, ...)``)."""
    sizes = [
        np.prod([int(d) for d in dims.split(',') if d])
        for dims in re.findall(r'\[([\d,]*)\]', state)
    ]
    return int(sum(sizes))


def step_collectives(hlo: str) -> dict[str, int]:
    """The collectives of one decoding step: the condition and body of the search's loop
    over the full batch, the while loop with the largest state (the stages of a shrinking
    batch are loops with smaller states; the random-number loops are tiny)."""
    computations = _computations(hlo)
    loops = re.findall(r'= (.*) while\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)', hlo)
    if not loops:
        return {}
    _, condition, body = max(loops, key=lambda loop: _state_size(loop[0]))
    seen: set = set()
    counts = _count(condition, computations, seen) + _count(body, computations, seen)
    return {kind: counts[kind] for kind in KINDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--devices', type=int, default=8)
    parser.add_argument('--out', default=None)
    args = parser.parse_args()
    os.environ.setdefault(
        'XLA_FLAGS', f'--xla_force_host_platform_device_count={max(args.devices, 8)}'
    )
    import jax

    from transformer import decoding
    from transformer.model import Transformer, TransformerConfig, abstract_params
    from transformer.training import ParallelSettings, decode_layout

    model = Transformer(
        TransformerConfig(
            vocab_size=8000,
            d_model=512,
            num_heads=8,
            d_ff=2048,
            num_encoder_layers=2,
            num_decoder_layers=2,
            dropout_rate=0.0,
            attention_impl='einsum',
        )
    )
    devices = jax.devices('cpu')[: args.devices]
    layouts = {
        'data': (ParallelSettings(), False),
        'fsdp': (ParallelSettings(fsdp=True), False),
        'fsdp + gather_params': (ParallelSettings(fsdp=True), True),
        'model axis 2': (ParallelSettings(model_parallelism=2), False),
    }
    shapes = abstract_params(model)
    rows, width = 64, 32
    results = []
    for name, (settings, gather) in layouts.items():
        layout = decode_layout(model, settings, gather_params=gather, devices=devices)
        params = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            shapes,
            layout.shardings(),
        )
        inputs = jax.ShapeDtypeStruct((rows, width), np.int32, sharding=layout.rows_sharding)
        for search, beam_size in (('greedy', 1), ('beam 4', 4)):
            run = jax.jit(
                lambda p, x, k=beam_size: decoding.translate_batch(model, p, x, beam_size=k)
            )
            with jax.set_mesh(layout.mesh):
                hlo = run.lower(params, inputs).compile().as_text()
            counts = step_collectives(hlo)
            results.append({'layout': name, 'search': search, 'devices': len(devices), **counts})
            print(json.dumps(results[-1]), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=2)


if __name__ == '__main__':
    main()
