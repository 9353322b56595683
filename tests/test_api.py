"""The Python API as the README and docs/api.md show it: every ```python block of both files
runs, in order, against a small trained run in runs/tiny, and loading a run prints none of
the libraries' routine notes."""

import dataclasses
import functools
import os
import pathlib
import re

import jax
import pytest

from tests.compiles import compiled_programs
from tests.tiny_run import SMALL
from transformer import api, schema

REPO = pathlib.Path(__file__).parents[1]


def _one_device() -> list:
    """What the tests of a loaded run check does not depend on its number of devices, and a
    program of one device compiles fastest."""
    return jax.devices('cpu')[:1]


def _blocks(name: str) -> list[str]:
    return re.findall(r'```python\n(.*?)```', (REPO / name).read_text(), re.S)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['README.md', 'docs/api.md'])
def test_the_documented_python_blocks_run(name, run_dir, tmp_path, monkeypatch):
    """Each block runs as written; `api.load` decodes on one device (its default is every
    device: 8 here, whose programs compile slower; a user's machine often has one)."""
    monkeypatch.setattr(api, 'load', functools.partial(api.load, devices=_one_device()))
    blocks = _blocks(name)
    assert blocks, f'{name} has no python block'
    (tmp_path / 'runs').mkdir()
    os.symlink(run_dir, tmp_path / 'runs' / 'tiny')
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, name, 'exec'), namespace)
    assert namespace['run'].steps == [4]  # run_dir's newest step (tiny averages 1)


@pytest.mark.slow
@pytest.mark.parametrize('after_a_command', [False, True])
def test_loading_a_run_is_quiet_and_leaves_logging_as_it_was(run_dir, caplog, after_a_command):
    """Also in a process where a command already filtered the libraries' logs for good (as a
    test worker that ran a command in-process before): those filters stay."""
    import logging

    from transformer.commands import library_logs

    loggers = [logging.getLogger(n) for n in ('absl', 'sacrebleu')]
    if after_a_command:
        library_logs.quiet_library_logs()
    try:
        before = [list(logger.filters) for logger in loggers]
        with caplog.at_level('WARNING'):
            run = api.load(str(run_dir), devices=_one_device())
        assert run.steps == [4]
        assert not [r for r in caplog.records if 'read only' in r.getMessage()]
        assert [list(logger.filters) for logger in loggers] == before
    finally:
        if after_a_command:
            library_logs.verbose_library_logs()


def test_build_checks_the_config_through_the_schema_as_the_commands_do():
    config = api.config('tiny')
    config.train.num_steps = 0  # the model never reads it: only the schema refuses it
    with pytest.raises(schema.ConfigError) as info:
        api.build(config)
    assert str(info.value) == 'train.num_steps=0 must be an integer >= 1.'
    config = api.config('tiny')
    config.model.dtype = 'float64'
    with pytest.raises(schema.ConfigError, match="model.dtype='float64' must be one of"):
        api.build(config)


def test_build_makes_the_model_of_the_parsed_config():
    config = api.config('tiny')
    config.update_from_flattened_dict({k: v for k, v in SMALL.items() if k.startswith('model.')})
    experiment = schema.parse(config)
    model, params = api.build(config)
    assert model.config == experiment.model
    assert params['encoder_layer_0']['self_attention']['query']['kernel'].shape == (32, 4, 8)
    model, _ = api.build(experiment, vocab_size=40)  # a parsed config, another vocabulary
    assert model.config == dataclasses.replace(experiment.model, vocab_size=40)


def test_logits_compile_one_program_per_model_and_shapes():
    """`api.logits` is one compiled program (run op by op, each operation compiled on its
    own): its first call compiles it alone, a call with new values of the same shapes
    compiles nothing."""
    import numpy as np

    from tests.random_params import fill_random
    from tests.tiny_run import tiny_model
    from transformer.model import abstract_params

    model = tiny_model()
    params = fill_random(abstract_params(model))
    inputs, targets = np.array([[5, 6, 7, 1]]), np.array([[8, 9, 1]])
    with compiled_programs() as compiled:
        first = api.logits(model, params, inputs, targets)
        assert compiled == ['jit(teacher_forced_logits)']
        again = api.logits(model, params, inputs + 1, targets + 1)
        assert compiled == ['jit(teacher_forced_logits)']
    assert first.shape == again.shape == (1, 3, model.config.vocab_size)
    assert not np.array_equal(first, again)


@pytest.mark.slow
def test_translate_takes_the_rule_and_a_new_setting_compiles_nothing(run_dir):
    """``length_penalty`` reaches the search (n-best scores are log_prob over that rule's
    penalty), and after the first call another alpha and rule compile no program."""
    import numpy as np

    from transformer import data as data_lib
    from transformer.decoding import length_penalty

    run = api.load(str(run_dir), devices=_one_device())
    lines = data_lib.load_text(run.config.data, 'test')[0][:3]
    run.translate(lines, beam_size=2, nbest=2)  # the run's alpha 0.6 and 'gnmt'
    with compiled_programs() as compiled:
        found = {
            rule: run.translate(lines, beam_size=2, nbest=2, alpha=1.3, length_penalty=rule)
            for rule in ('fairseq', 'gnmt')
        }
    assert compiled == []
    for rule, hypotheses in found.items():
        for h in (h for line in hypotheses for h in line):
            length = len(run.tokenizer.encode(h.text)) + 1  # its pieces and EOS
            penalty = float(length_penalty(length, 1.3, rule))
            np.testing.assert_allclose(h.score * penalty, h.log_prob, rtol=1e-3, atol=1e-3)
    # A negative alpha (which the config and the flags refuse) is refused here too, greedy
    # included, before anything is decoded.
    for beam_size in (1, 2):
        with pytest.raises(ValueError, match=r'^alpha must be >= 0 .*, got -0\.2\.$'):
            run.translate(lines, beam_size=beam_size, alpha=-0.2)
