"""Attention maps of every layer and head, and their figure."""

import numpy as np
import pytest

from transformer import visualize
from transformer.checkpoint import load_model
from transformer.tokens import EOS_ID


def test_attention_maps_cover_every_layer_and_head(run_dir, tmp_path):
    """visualize: one [N, T, S] map per (stack, layer, kind), rows summing to 1, and a figure."""
    _, tokenizer, model, params, _ = load_model(str(run_dir))
    inputs = np.array(tokenizer.encode('ze bix pud .') + [EOS_ID], np.int32)
    targets = np.array(tokenizer.encode('lo bix pud .') + [EOS_ID], np.int32)
    maps = visualize.attention_maps(model, params, inputs, targets)
    assert sorted(maps) == [
        ('decoder', 0, 'cross_attention'),
        ('decoder', 0, 'self_attention'),
        ('encoder', 0, 'self_attention'),
    ]
    num_heads = model.config.num_heads
    assert maps[('encoder', 0, 'self_attention')].shape == (num_heads, len(inputs), len(inputs))
    assert maps[('decoder', 0, 'cross_attention')].shape == (num_heads, len(targets), len(inputs))
    for weights in maps.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    causal = maps[('decoder', 0, 'self_attention')]
    assert np.all(np.triu(causal, k=1) == 0)
    out = tmp_path / 'attention.png'
    visualize.plot_attention(maps, [str(i) for i in inputs], [str(i) for i in targets], str(out))
    assert out.stat().st_size > 1000


@pytest.mark.slow
def test_the_command_names_special_tokens_and_warns_on_empty_or_unknown_text(
    run_dir, tmp_path, caplog
):
    """visualize --text '' and a text of unknown characters draw a figure with a one-line
    warning each; EOS is labelled </s> (it was drawn as <1>) and unknown pieces <unk>.
    The empty text is drawn against its greedy translation (the default target); the other
    against a given --target, as the warning comes from the source alone: a second greedy
    search of the 4-step run (its translations run to the length limit) costs ~10 s."""
    _, tokenizer, _, _, _ = load_model(str(run_dir))
    assert visualize.token_labels(tokenizer, [EOS_ID, 2, 0]) == ['</s>', '<unk>', '<pad>']
    cases = [
        ('', [], '--text is empty'),
        ('ζζζ ж', ['--target=lo bix pud .'], 'not in the vocabulary (<unk>)'),
    ]
    for text, target, warning in cases:
        out = tmp_path / 'attention.png'
        caplog.clear()
        argv = ['visualize', f'--workdir={run_dir}', f'--text={text}', f'--out={out}', *target]
        with pytest.raises(SystemExit) as info:
            visualize.cli(argv)
        assert not info.value.code and out.stat().st_size > 1000
        warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
        assert [w for w in warnings if warning in w], warnings
    ids = tokenizer.encode('ze bix pud .')
    assert visualize.input_warnings('ze bix pud .', ids, tokenizer.special.unk) == []
