"""A train state of NLLB-200-distilled-600M's shape saved and restored as training does: the
peak host memory of each against the memory bound training checks first.

The model is the one converting NLLB-200-distilled-600M gives (12 + 12 layers, d_model 1024,
FFN 4096, 16 heads, V = 256206; pre-LN with final norms, biased attention, fairseq's
sinusoids, one tied table: transformer/interop/fairseq_config.py's model section, which
tests/benchmarks/test_large_vocab_checkpoint.py holds this one to). Its state as training saves
it (parameters and Adam's two moments, 3 x 4 bytes a parameter) gets random values, drawn
leaf by leaf. Each phase runs in a process of its own, with its own peak RSS (`os.wait4`):
``save`` builds the state and saves it with `checkpoint.Checkpoints` (Orbax, then the
manifest), ``restore`` restores it into the layout one device holds, as a resume does, and
checks every leaf's sum against the saved one. The bound is
`training.memory_needs`' weights (the layers' and the embeddings': value, gradient and two
moments, 4 x 4 bytes a parameter), which each phase's peak beyond the runtime's own (the
``baseline`` phase: jax and the modules imported, the state's shapes traced, no array) must
fit.

    python benchmarks/large_vocab_checkpoint.py --out benchmarks/results/large_vocab_checkpoint.json
    python benchmarks/large_vocab_checkpoint.py --size narrow \
        --out benchmarks/results/large_vocab_checkpoint_narrow.json
    python benchmarks/large_vocab_checkpoint.py --size tiny --work /tmp/lvc_tiny --out /tmp/lvc.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# converted NLLB-200's model section (transformer/interop/fairseq_config.py `model_settings`
# of its config.json), and a tiny one of the same kind for the smoke test.
NLLB = {
    'd_model': 1024,
    'num_heads': 16,
    'd_ff': 4096,
    'num_encoder_layers': 12,
    'num_decoder_layers': 12,
    'ffn': 'relu',
    'scale_embedding': True,
    'dropout_rate': 0.1,
    'attention_dropout_rate': 0.1,
    'relu_dropout_rate': 0.0,
    'attention_bias': True,
    'pre_layer_norm': True,
    'layer_norm_epsilon': 1e-05,
    'share_embeddings': 'all',
    'positions': 'fairseq_sinusoidal',
    'logits_bias': False,
}
NARROW = {**NLLB, 'd_model': 256, 'num_heads': 4, 'd_ff': 1024}
NARROW |= {'num_encoder_layers': 2, 'num_decoder_layers': 2}
TINY = {**NLLB, 'd_model': 16, 'num_heads': 2, 'd_ff': 32}
TINY |= {'num_encoder_layers': 1, 'num_decoder_layers': 1}
# model section, vocabulary: 'narrow' (69M parameters, the embedding 95% of them) fits a host
# shared with other work.
SIZES = {'600m': (NLLB, 256_206), 'narrow': (NARROW, 256_206), 'tiny': (TINY, 70_000)}
CHILD = 'import sys; from benchmarks import large_vocab_checkpoint as m; m.child(*sys.argv[1:])'
GiB = 2**30


def experiment(size: str):
    """The typed config of ``size`` (configs/base.py's, the model section replaced)."""
    from transformer import configs, schema

    model, vocab = SIZES[size]
    config = configs.load('base')
    config.model.update(model)
    config.data.vocab_size = vocab
    config.train.async_checkpointing = False
    return schema.parse(config)


def _state(size: str):
    """(config, the train state's shapes) of ``size``: the model's parameters and Adam's
    state, as training builds them (`training.init_state`), traced, nothing allocated."""
    import jax

    from transformer import training

    exp = experiment(size)
    model = training.build_model(exp, exp.data.vocab_size)
    tx, _ = training.make_optimizer(exp.opt, exp.model.d_model, exp.train.num_steps)
    return exp, jax.eval_shape(lambda: training.init_state(model, tx, jax.random.key(0), 8))


def _random(shapes):
    """A state of ``shapes`` with random values, drawn leaf by leaf on the host into a buffer
    aligned to 64 bytes, which the CPU client then holds as the array itself (no copy), so
    that building it holds the state alone (a copy would hold one leaf more, and the model's
    jitted initializers held 4x the state in XLA's temporaries). The moments are random too:
    a fresh state's zeros would compress on disk as a trained state's moments do not."""
    import jax
    import numpy as np

    leaves, tree = jax.tree.flatten(shapes)
    placed = []
    for i, leaf in enumerate(leaves):
        value = _aligned(leaf.shape, leaf.dtype)
        if np.issubdtype(leaf.dtype, np.floating):
            np.random.default_rng(i).standard_normal(leaf.shape, value.dtype, out=value)
            value *= 0.02
        else:
            value[...] = 0
        placed.append(jax.device_put(value, may_alias=True))
        del value
    return tree.unflatten(placed)


def _aligned(shape, dtype):
    """An uninitialised host array of ``shape`` whose data starts on a 64-byte boundary (the
    alignment the CPU client needs to use host memory in place)."""
    import numpy as np

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _sums(state) -> list[float]:
    """Each leaf's sum, accumulated in float64 without a float64 copy of the leaf."""
    import jax
    import numpy as np

    return [float(np.sum(np.asarray(leaf), dtype=np.float64)) for leaf in jax.tree.leaves(state)]


def _peak_gib() -> float:
    """This process's peak RSS so far (Linux counts ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child(phase: str, size: str, work: str, out: str) -> None:
    """One measured phase (module docstring), its figures written to ``out`` as JSON."""
    import jax

    from transformer.checkpoint import Checkpoints

    exp, shapes = _state(size)
    start = time.perf_counter()
    if phase == 'baseline':  # the runtime alone: jax, the modules, the state's shapes
        found = {'shapes': len(jax.tree.leaves(shapes))}
    elif phase == 'save':
        state = jax.block_until_ready(_random(shapes))
        built, built_peak = time.perf_counter() - start, _peak_gib()
        sums = _sums(state)
        start = time.perf_counter()
        checkpoints = Checkpoints(work, exp)
        checkpoints.save(state, {})
        checkpoints.seal()
        found = {'build_s': built, 'build_peak_rss_gib': built_peak}
        found |= {'save_s': time.perf_counter() - start, 'sums': sums}
    else:
        device = jax.devices()[0]
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)
            ),
            shapes,
        )
        state, _, step = Checkpoints(work, exp).restore_latest(abstract)
        jax.block_until_ready(state)
        found = {'restore_s': time.perf_counter() - start, 'step': step, 'sums': _sums(state)}
    pathlib.Path(out).write_text(json.dumps(found))


def _measured(phase: str, size: str, work: pathlib.Path) -> dict:
    """Runs ``phase`` in a child: its figures, wall seconds and peak RSS."""
    out = work / f'{phase}.json'
    env = {**os.environ, 'PYTHONPATH': str(REPO)}
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, '-c', CHILD, phase, size, str(work / 'run'), str(out)], env=env
    )
    _, status, usage = os.wait4(process.pid, 0)  # this child's own peak
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f'large_vocab_checkpoint.py: the {phase} phase failed (see above).')
    found = json.loads(out.read_text())
    return found | {'wall_s': time.perf_counter() - start, 'peak_rss_gib': usage.ru_maxrss / 2**20}


def _bound(size: str) -> dict:
    """The memory bound's weight parts for ``size`` on one device, and the parameters."""
    from transformer import training
    from transformer.model import param_count

    exp = experiment(size)
    parts = training.memory_needs(exp, 1, vocab_size=exp.data.vocab_size)
    weights = {k: v[0] for k, v in parts.items() if 'weights' in k or 'embeddings' in k}
    params = param_count(training.build_model(exp, exp.data.vocab_size).config)
    return {'params': params, 'bound_gib': sum(weights.values()) / GiB, 'parts': weights}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--size', choices=sorted(SIZES), default='600m')
    parser.add_argument('--work', default='/tmp/large_vocab_checkpoint', help='the run directory')
    parser.add_argument('--out', default='benchmarks/results/large_vocab_checkpoint.json')
    args = parser.parse_args(argv)
    from benchmarks import common

    work = pathlib.Path(args.work)
    if (work / 'run').exists():
        shutil.rmtree(work / 'run')
    work.mkdir(parents=True, exist_ok=True)
    bound = _bound(args.size)
    baseline = _measured('baseline', args.size, work)
    save = _measured('save', args.size, work)
    disk = sum(f.stat().st_size for f in (work / 'run').rglob('*') if f.is_file())
    restore = _measured('restore', args.size, work)
    report = {
        'size': args.size,
        **bound,
        'state_gib': 3 * 4 * bound['params'] / GiB,  # parameters and Adam's two moments
        'checkpoint_gib': disk / GiB,
        'same_values': save.pop('sums') == restore.pop('sums'),
        'baseline_rss_gib': baseline['peak_rss_gib'],
        'save': save,
        'restore': restore,
        'host': common.host(),
    }
    for phase in (save, restore):  # beyond the runtime's own memory
        phase['state_rss_gib'] = phase['peak_rss_gib'] - baseline['peak_rss_gib']
    report['within_bound'] = all(p['state_rss_gib'] <= report['bound_gib'] for p in (save, restore))
    common.write_report(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k != 'host'}, indent=2))
    return report


if __name__ == '__main__':
    main()
