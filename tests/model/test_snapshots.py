"""The train state's tree and the train step's lowered program are those written in
tests/fixtures/snapshots/ (tests/model/snapshots.py says what they hold and how to refresh
them): a change of how the model is built or called (another Flax API behind transformer/model's
functional interface) keeps every parameter path, shape and logical spec, and the program the
step compiles."""

import json

import jax
import pytest

from tests.model import snapshots

REFRESH = 'PYTHONPATH=$PWD python -m tests.model.snapshots'
pytestmark = pytest.mark.skipif(
    jax.default_backend() != 'cpu',
    reason="the snapshots are the CPU's ('auto' choices and lowering resolve per backend)",
)


def _saved(case: str) -> dict:
    return json.loads(snapshots.path(case).read_text())


def _diff(saved: dict, now: dict) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f'{k}: {saved.get(k)} -> {now.get(k)}' for k in keys if saved.get(k) != now.get(k)]


@pytest.mark.parametrize('case', snapshots.CASES)
def test_the_train_states_tree_is_the_snapshots(case):
    """Paths, shapes, dtypes and logical specs of the parameters and Adam's moments."""
    diff = _diff(_saved(case)['state'], snapshots.state_tree(case))
    assert not diff, f'{len(diff)} leaves differ (refresh: {REFRESH}): {diff[:10]}'


@pytest.mark.parametrize('case', snapshots.CASES)
def test_the_lowered_train_step_is_the_snapshots(case):
    """How many of each op the step holds before XLA optimises it."""
    diff = _diff(_saved(case)['lowered_ops'], snapshots.op_histogram(case))
    assert not diff, f'ops differ (refresh: {REFRESH}): {diff}'


def test_the_snapshot_tells_a_changed_tree_apart():
    saved = _saved('tiny')['state']
    changed = dict(saved)
    path = next(k for k in saved if k.endswith("['scale']"))
    changed[path] = [saved[path][0], saved[path][1], ['mlp']]
    assert _diff(saved, changed) == [f'{path}: {saved[path]} -> {changed[path]}']
