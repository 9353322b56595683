"""What a change inside transformer/model/ must leave as it is, written down: the train state's
tree (every parameter's and Adam moment's path, shape, dtype and logical partition spec) and
the op histogram of the tiny config's train step as lowered (StableHLO before XLA optimises
it). tests/model/test_snapshots.py compares them with the files in tests/fixtures/snapshots/.

A change meant to alter them (a new parameter, another jax) refreshes the files with one
command, then the diff shows what moved:

    PYTHONPATH=$PWD python -m tests.model.snapshots

Both are taken on the CPU (the tiny config's 'auto' choices resolve per backend).
"""

from __future__ import annotations

import collections
import json
import pathlib
import re

import jax
import jax.numpy as jnp

from transformer import configs, schema
from transformer.training import optim, parallel, steps

DIRECTORY = pathlib.Path(__file__).parents[1] / 'fixtures' / 'snapshots'
ROWS, LENGTH = 4, 16
# The tiny config as it trains on a CPU, and with what its defaults leave out: dropout (masks
# drawn in the step), pre-LN (final norms) and three embedding matrices.
CASES = {
    'tiny': {},
    'tiny_dropout_preln_untied': {
        'dropout_rate': 0.1,
        'attention_dropout_rate': 0.1,
        'relu_dropout_rate': 0.1,
        'pre_layer_norm': True,
        'share_embeddings': 'none',
    },
}
# The op of each statement of the lowered text: 'stablehlo.add', 'sdy.mesh', 'call' and
# 'return' (func.call and func.return as MLIR prints them), ...
_OP = re.compile(r'^\s*(?:%[^=]+=\s*)?"?([a-z_]+\.[a-z_.]+|call|return)\b', re.MULTILINE)


def experiment(case: str) -> schema.Experiment:
    """The tiny config with ``CASES[case]``'s model fields, as the CPU runs it."""
    config = configs.load('tiny')
    config.model.update({'attention_impl': 'einsum', 'embedding_grad': 'scatter', **CASES[case]})
    return schema.parse(config)


def _parts(case: str):
    exp = experiment(case)
    model = steps.build_model(exp, exp.data.vocab_size)
    tx, schedule = optim.make_optimizer(exp.opt, d_model=model.config.d_model)
    return exp, model, tx, schedule


def state_tree(case: str) -> dict[str, list]:
    """{path: [shape, dtype, logical spec]} of every leaf of the train state."""
    _, model, tx, _ = _parts(case)
    shapes = jax.eval_shape(lambda: steps.init_state(model, tx, jax.random.key(0), 8))
    specs = parallel.logical_specs(model, tx)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    spec_of = {
        jax.tree_util.keystr(k): list(map(str, v))
        for k, v in jax.tree_util.tree_leaves_with_path(specs, is_leaf=is_spec)
    }
    return {
        jax.tree_util.keystr(k): [list(v.shape), str(v.dtype), spec_of[jax.tree_util.keystr(k)]]
        for k, v in jax.tree_util.tree_leaves_with_path(shapes)
    }


def lowered_text(case: str) -> str:
    """The train step of ``case`` on ROWS x LENGTH rows, lowered for the CPU."""
    exp, model, tx, schedule = _parts(case)
    cpu = jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])
    state = jax.eval_shape(lambda: steps.init_state(model, tx, jax.random.key(0), 8))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), state)
    tokens = jax.ShapeDtypeStruct((ROWS, LENGTH), jnp.int32, sharding=cpu)
    keys = ('inputs', 'targets', 'inputs_segmentation', 'targets_segmentation')
    batch = {k: tokens for k in (*keys, 'inputs_positions', 'targets_positions')}
    rng = jax.eval_shape(lambda: steps.dropout_key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=cpu)

    def step(state, batch, rng):
        return steps.train_step(
            state,
            batch,
            rng,
            model=model,
            tx=tx,
            schedule=schedule,
            label_smoothing=exp.train.label_smoothing,
            accum_steps=1,
        )

    return jax.jit(step).lower(state, batch, rng).as_text()


def op_histogram(case: str) -> dict[str, int]:
    """{op name: how many times the lowered train step of ``case`` holds it}."""
    return dict(sorted(collections.Counter(_OP.findall(lowered_text(case))).items()))


def snapshot(case: str) -> dict:
    return {'state': state_tree(case), 'lowered_ops': op_histogram(case)}


def path(case: str) -> pathlib.Path:
    return DIRECTORY / f'{case}.json'


def main() -> None:
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        path(case).write_text(json.dumps(snapshot(case), indent=1, sort_keys=True) + '\n')
        print(f'wrote {path(case)}')


if __name__ == '__main__':
    main()
