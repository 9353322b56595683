"""export --format hf of converted T5 runs (tests/t5_dirs.py's): every tensor, the head
of its own included, and the config and tokenizer files come back; transformers reads the
export and gives the original's logits; a ReLU feed-forward bias that is not zero is refused
in one line before anything is written."""

import json

import jax
import numpy as np
import pytest

from tests.t5_dirs import NAMES, hf_model, lines
from transformer import export
from transformer.checkpoint import load_model
from transformer.formats import ExportError
from transformer.interop import t5_export

_SKIP = "{} is not installed: pip install -e '.[export]'"
torch = pytest.importorskip('torch', reason=_SKIP.format('torch'))
transformers = pytest.importorskip('transformers', reason=_SKIP.format('transformers'))


def _tensors(directory):
    from safetensors.numpy import load_file

    found = {}
    for file in sorted(directory.glob('*.safetensors')):
        found |= load_file(file)
    return found


@pytest.mark.slow  # an export each, read back by transformers
@pytest.mark.parametrize('name', NAMES)
def test_export_gives_back_every_tensor_the_files_and_the_logits(
    t5_hf_dirs, t5_runs, name, tmp_path
):
    out = tmp_path / 'hf'
    with pytest.raises(SystemExit) as info:
        export.cli(['export', f'--workdir={t5_runs / name}', f'--out={out}', '--format=hf'])
    assert info.value.code is None, info.value.code
    original, exported = _tensors(t5_hf_dirs / name), _tensors(out)
    assert sorted(original) == sorted(exported)
    assert ('lm_head.weight' in exported) is (name != 'v1.0')
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    source = json.loads((t5_hf_dirs / name / 'config.json').read_text())
    written = json.loads((out / 'config.json').read_text())
    assert {k: v for k, v in written.items() if k != 'dtype'} == {
        k: v for k, v in source.items() if k not in ('dtype', 'torch_dtype')
    }
    for file in ('spiece.model', 'tokenizer.json'):
        if (t5_hf_dirs / name / file).exists():
            assert (out / file).read_bytes() == (t5_hf_dirs / name / file).read_bytes()
    theirs = transformers.AutoTokenizer.from_pretrained(str(out))
    want = transformers.T5Tokenizer.from_pretrained(str(t5_hf_dirs / 'v1.1'))
    assert theirs(lines(10)).input_ids == want(lines(10)).input_ids
    inputs = torch.as_tensor(want(lines(3, seed=7), padding=True).input_ids)
    decoder = torch.as_tensor(want(lines(3, seed=8), padding=True).input_ids)
    with torch.no_grad():
        a = hf_model(t5_hf_dirs / name)(input_ids=inputs, decoder_input_ids=decoder).logits
        b = hf_model(out)(input_ids=inputs, decoder_input_ids=decoder).logits
    assert a.abs().max() > 1
    np.testing.assert_array_equal(b.numpy(), a.numpy())


def test_a_relu_bias_that_is_not_zero_is_refused_in_one_line(t5_runs, tmp_path):
    config, vocab, model, params, _ = load_model(str(t5_runs / 'v1.0'), scan_layers=False)
    params = jax.tree.map(np.array, params)  # writable copies
    params['decoder_layer_1']['ffn']['wo']['bias'][3] = 0.5
    with pytest.raises(ExportError) as info:
        t5_export.write_hf(str(tmp_path), model.config, config, vocab, params, length_exponent=1.0)
    assert 'decoder_layer_1/ffn/wo/bias is not zero' in str(info.value)
    assert '\n' not in str(info.value) and not list(tmp_path.iterdir())


@pytest.mark.slow  # transformers reads the export
def test_a_run_without_the_source_files_exports_a_whole_config(t5_hf_dirs, t5_runs, tmp_path):
    """A run fine-tuned from T5 (no converted files to write back): config.json and
    generation_config.json are written whole, and transformers gives the original's logits."""
    config, vocab, model, params, _ = load_model(str(t5_runs / 'v1.1'), scan_layers=False)
    t5_export.write_hf(str(tmp_path), model.config, config, vocab, params, length_exponent=0.6)
    written = json.loads((tmp_path / 'config.json').read_text())
    assert (written['model_type'], written['feed_forward_proj']) == ('t5', 'gated-gelu')
    assert (written['d_kv'], written['tie_word_embeddings']) == (6, False)
    generation = json.loads((tmp_path / 'generation_config.json').read_text())
    assert (generation['decoder_start_token_id'], generation['length_penalty']) == (0, 0.6)
    inputs = torch.as_tensor([[5, 9, 12, 1]])
    with torch.no_grad():
        a = hf_model(t5_hf_dirs / 'v1.1')(input_ids=inputs, decoder_input_ids=inputs).logits
        b = hf_model(tmp_path)(input_ids=inputs, decoder_input_ids=inputs).logits
    np.testing.assert_array_equal(b.numpy(), a.numpy())
