"""A step's arrays within the memory bound: written uncompressed, read back in batches of at
most the largest leaf, largest first; steps written compressed (before) still restore."""

import jax
import numpy as np
import orbax.checkpoint as ocp

from tests.tiny_run import tiny_run_config
from transformer.checkpoint import arrays
from transformer.checkpoint.directory import checkpoint_manager

MiB = 2**20


def test_batches_take_the_largest_leaves_first_and_hold_at_most_the_largest():
    sizes = [3 * MiB, 100 * MiB, 40 * MiB, 100 * MiB, 70 * MiB, 1 * MiB]
    groups = arrays.batches(sizes)
    assert groups == [[1], [3], [4], [2, 0, 5]]
    assert all(sum(sizes[i] for i in g) <= 100 * MiB for g in groups)
    # a small model's state: one call
    assert arrays.batches([MiB] * 10) == [list(range(10))]


def _state():
    rng = np.random.default_rng(0)
    params = {'embed': rng.normal(size=(64, 16)), 'w': rng.normal(size=(16, 8)), 'b': np.ones(8)}
    moments = {k: (v * 0.5, np.abs(v)) for k, v in params.items()}
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x, np.float32)), (params, moments))


def _abstract(tree):
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree)


def _save(manager, params, opt_state, meta):
    manager.save(
        1,
        args=ocp.args.Composite(
            params=arrays.save_args(params),
            opt_state=arrays.save_args(opt_state),
            meta=ocp.args.JsonSave(meta),
        ),
    )
    manager.wait_until_finished()


def test_a_restore_reads_one_batch_per_call_and_gives_back_every_leaf(tmp_path, monkeypatch):
    params, opt_state = _state()
    manager = checkpoint_manager(str(tmp_path), tiny_run_config(2))
    _save(manager, params, opt_state, {'step': 1})
    calls = []
    restore = manager.restore

    def counted(step, args):
        trees = [args[k].item for k in args.keys() if k in arrays.ARRAY_ITEMS]
        calls.append(sum(x.size * 4 for x in jax.tree.leaves(trees) if x is not ocp.PLACEHOLDER))
        return restore(step, args=args)

    monkeypatch.setattr(manager, 'restore', counted)
    monkeypatch.setattr(arrays, 'MIN_BATCH_BYTES', 1)
    collections = []
    monkeypatch.setattr(arrays.gc, 'collect', lambda: collections.append(len(calls)))
    targets = {'params': _abstract(params), 'opt_state': _abstract(opt_state)}
    got = arrays.restore(manager, 1, targets, meta=ocp.args.JsonRestore())
    # 9 leaves; the largest (64 x 16 floats, three of them) each alone, the rest in one.
    assert calls == [4096, 4096, 4096, 3 * (512 + 32)]
    # Garbage is collected between batches, not after the last (a restore in one batch,
    # a small model's, runs no full collection).
    assert collections == [1, 2, 3]
    assert got['meta'] == {'step': 1}
    back = jax.tree.leaves((got['params'], got['opt_state']))
    for saved, value in zip(jax.tree.leaves((params, opt_state)), back, strict=True):
        np.testing.assert_array_equal(np.asarray(value), np.asarray(saved))
    assert jax.tree.structure(got['opt_state']) == jax.tree.structure(opt_state)


def test_arrays_are_written_uncompressed_and_compressed_steps_still_restore(tmp_path):
    zeros = {'w': jax.device_put(np.zeros((256, 1024), np.float32))}  # 1 MiB
    manager = checkpoint_manager(str(tmp_path / 'new'), tiny_run_config(2))
    manager.save(1, args=ocp.args.Composite(params=arrays.save_args(zeros)))
    manager.wait_until_finished()
    written = sum(f.stat().st_size for f in (tmp_path / 'new').rglob('*') if f.is_file())
    assert written >= MiB  # zstd wrote these zeros in a few hundred bytes
    # a step as this package wrote it before: Orbax's standard handler, zstd
    old = ocp.CheckpointManager(str(tmp_path / 'old' / 'checkpoints'), item_names=('params',))
    params, _ = _state()
    old.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
    old.wait_until_finished()
    got = arrays.restore(
        checkpoint_manager(str(tmp_path / 'old')), 1, {'params': _abstract(params)}
    )
    for name, value in params.items():
        np.testing.assert_array_equal(np.asarray(got['params'][name]), np.asarray(value))
