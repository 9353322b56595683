"""transformer/configs/multi30k.py: one config, named variants; the published recipe exactly;
an earlier config name says, in one line, which variant holds its settings."""

import os
import sys

import jax
import pytest

from transformer import configs
from transformer.commands import console, train
from transformer.configs import multi30k
from transformer.training import config_checks

ALL = [*multi30k.VARIANTS, *multi30k.EARLIER]
RENAMED = {
    'multi30k_tiny': 'tiny_cpu',
    'multi30k_dropout02': 'dropout02',
    'multi30k_bf16': 'bf16',
    'multi30k_dropout02_bf16': 'dropout02_bf16',
    'multi30k_cooldown': 'cooldown',
    'multi30k_dropout03': 'dropout03',
    'multi30k_ensemble': 'ensemble',
    'multi30k_lowercase': 'lowercase',
}


@pytest.mark.parametrize('variant', ALL)
def test_every_variant_passes_the_checks(variant):
    config = configs.load(f'multi30k:{variant}')
    config_checks.check(config, devices=jax.devices('cpu'))
    assert config.data.dataset == 'multi30k' and config.data.test_split == 'test2016'


def test_tiny_is_the_published_transformer_tiny_recipe():
    """Wu et al. (2021): 4+4 layers of width 128, 4 heads, d_ff 256, dropout 0.3, Adam peaking
    at 0.005 after 2000 warm-up steps, 2 x 4096 target tokens a step, a 10k joint vocabulary,
    8000 updates, the last 10 checkpoints averaged, beam 5."""
    c = multi30k.get_config('tiny')
    m = c.model
    assert (m.d_model, m.num_heads, m.d_ff, m.num_encoder_layers, m.num_decoder_layers) == (
        128, 4, 256, 4, 4,
    )  # fmt: skip
    assert m.dropout_rate == 0.3 and m.share_embeddings == 'all'
    peak = c.opt.lr_scale * m.d_model**-0.5 * c.opt.warmup_steps**-0.5
    assert c.opt.warmup_steps == 2000 and peak == pytest.approx(0.005, rel=0.03)
    assert c.train.batch_size * c.data.max_len == 2 * 4096
    assert (c.data.vocab_size, c.train.num_steps) == (10_000, 8000)
    assert (c.eval.average_last, c.eval.beam_size) == (10, 5)
    assert c.train.keep_checkpoints >= c.eval.average_last


@pytest.mark.parametrize('form', ['configs/{}.py', '{}'])
@pytest.mark.parametrize('old, variant', sorted(RENAMED.items()))
def test_an_earlier_name_says_its_variant_in_one_line(
    old, variant, form, tmp_path, monkeypatch, capsys
):
    """`python train.py --config configs/multi30k_tiny.py` (or the packaged name): one line
    naming the variant with the same settings, exit code 2, nothing trained; `configs.load`
    (the Python API) raises the same line."""
    given = form.format(old)
    new = form.format('multi30k')
    line = f'{given} is now {new}:{variant} (the same settings).'
    assert variant in ALL
    argv = ['train.py', f'--config={given}', f'--workdir={tmp_path}/run']
    monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads its flags from sys.argv
    with pytest.raises(SystemExit) as info:
        train.cli(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f'error: {line}']
    with pytest.raises(ValueError) as raised:
        configs.load(given)
    assert str(raised.value) == line
    assert not (tmp_path / 'run').exists()


def test_a_variant_is_named_after_a_colon_on_the_command_line():
    """`--config multi30k:tiny` and `--config configs/multi30k.py:tiny` reach ml_collections
    as the file and the variant; an unknown variant is one line that lists them."""
    args = console.resolve_config_arg(['t', '--config', 'multi30k:tiny'])
    assert args[2] == configs.path('multi30k') + ':tiny' and os.path.isfile(
        configs.path('multi30k')
    )
    assert (
        configs.load('configs/multi30k.py:tiny').to_dict() == multi30k.get_config('tiny').to_dict()
    )
    with pytest.raises(ValueError, match=r"has no variant 'nosuch': '', 'dropout02', 'tiny_cpu'"):
        configs.load('multi30k:nosuch')
