"""M2M100 (NLLB-200's layout) and mBART directories read into this project's model and written
back (transformer/interop/fairseq.py, fairseq_params.py, fairseq_export.py): a directory saved
by transformers' own ``save_pretrained`` reads to Hugging Face's teacher-forced logits, whole,
sharded or as pytorch_model.bin; its export loads back into transformers with every tensor
equal; config.json's keys become the model section, generation_config.json's the eval
settings; what this model cannot compute stops in one line naming the key."""

import dataclasses
import json

import numpy as np
import pytest

from tests.model.test_model import random_params
from tests.shared_dirs import built_once
from transformer.formats import ExportError
from transformer.interop import fairseq, fairseq_export
from transformer.interop.fairseq_params import (
    FairseqError,
    params_from_state_dict,
    sinusoid_rows,
    state_dict_from_params,
)
from transformer.model import TransformerConfig

FAMILIES = ('m2m100', 'mbart')
# Tiny configs as Hugging Face writes them (transformers' own keys; fairseq's ids).
CONFIGS = {
    'm2m100': {
        'model_type': 'm2m_100',
        'architectures': ['M2M100ForConditionalGeneration'],
        'activation_function': 'relu',
        'scale_embedding': True,
    },
    'mbart': {
        'model_type': 'mbart',
        'architectures': ['MBartForConditionalGeneration'],
        'activation_function': 'gelu',
        'scale_embedding': False,
        'normalize_before': True,
        'add_final_layer_norm': True,
    },
}
SHAPE = {
    **dict(vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2),
    **dict(encoder_attention_heads=2, decoder_attention_heads=2),
    **dict(encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=20),
    **dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    **dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
}


def _directory(tmp_path, family: str, generation=None, **changes):
    """A directory of ``family``'s config.json with ``changes`` (None: the key removed) and,
    given, a generation_config.json; no weights."""
    config = {**CONFIGS[family], **SHAPE}
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    directory = tmp_path / family
    directory.mkdir()
    (directory / 'config.json').write_text(json.dumps(config))
    if generation is not None:
        (directory / 'generation_config.json').write_text(json.dumps(generation))
    return directory


@pytest.mark.parametrize(
    'family, changes, says',
    [
        ('m2m100', {'model_type': 'nllb-moe'}, "model_type='nllb-moe' is not handled"),
        ('m2m100', {'model_type': 'bart'}, "model_type='bart' is neither"),
        ('m2m100', {'num_experts': 4}, "num_experts=4 is NLLB-MoE's"),
        ('m2m100', {'decoder_attention_heads': 4}, 'decoder_attention_heads=4 differs'),
        ('mbart', {'decoder_ffn_dim': 64}, 'decoder_ffn_dim=64 differs'),
        ('mbart', {'activation_function': 'gelu_new'}, "activation_function='gelu_new' is not"),
        ('m2m100', {'tie_word_embeddings': False}, 'tie_word_embeddings=False is not'),
        ('mbart', {'normalize_before': False}, 'normalize_before=False is not'),
        ('mbart', {'add_final_layer_norm': False}, 'add_final_layer_norm=False is not'),
        ('mbart', {'normalize_embedding': False}, 'normalize_embedding=False is not'),
        ('m2m100', {'d_model': 15}, 'd_model=15 must be'),
        ('m2m100', {'encoder_layers': 0}, 'encoder_layers=0 is not'),
        ('m2m100', {'pad_token_id': 0}, 'pad_token_id=0 is not 1'),
        ('mbart', {'decoder_start_token_id': 0}, 'decoder_start_token_id=0 is not 2'),
        ('mbart', {'decoder_start_token_id': None}, 'decoder_start_token_id is not set'),
        ('m2m100', {'scale_embedding': 'yes'}, "scale_embedding='yes' is not true or false"),
    ],
)
def test_config_values_this_model_cannot_compute_stop_in_one_line_naming_the_key(
    tmp_path, family, changes, says
):
    directory = _directory(tmp_path, family, **changes)
    with pytest.raises(FairseqError) as info:
        fairseq.read(str(directory), weights=False)
    message = str(info.value)
    assert message.startswith(str(directory)) and says in message and '\n' not in message


@pytest.mark.parametrize(
    'generation, says',
    [
        ({'no_repeat_ngram_size': 3}, 'no_repeat_ngram_size=3 is not recorded'),
        ({'min_length': 5}, 'min_length=5 is not recorded'),
        ({'forced_bos_token_id': 40}, 'forced_bos_token_id=40 is not an id below'),
        ({'length_penalty': -1.0}, 'length_penalty=-1.0 is not expressible'),
        ({'bad_words_ids': [[5, 6]]}, 'a sequence of 2 tokens'),
        ({'forced_eos_token_id': 1}, 'forced_eos_token_id=1 is not 2'),
        ({'pad_token_id': 1}, 'decoder_start_token_id is not set'),
    ],
)
def test_generation_settings_without_a_setting_here_stop_in_one_line(tmp_path, generation, says):
    generation = {'decoder_start_token_id': 2} | generation
    if 'decoder_start_token_id is not set' in says:
        del generation['decoder_start_token_id']
    directory = _directory(tmp_path, 'm2m100', generation=generation)
    with pytest.raises(FairseqError) as info:
        fairseq.read(str(directory), weights=False)
    message = str(info.value)
    assert str(directory / 'generation_config.json') in message
    assert says in message and '\n' not in message


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('scale', [True, False, None])
def test_model_section_follows_config_json_scale_embedding_either_way(tmp_path, family, scale):
    """Each value read from its key: a scale left out is the config class's default (M2M100's
    true, MBart's false, as transformers 5 reads it); the rest is the family's network."""
    read = fairseq.read(str(_directory(tmp_path, family, scale_embedding=scale)), weights=False)
    default = {'m2m100': True, 'mbart': False}[family]
    assert read.model['scale_embedding'] is (default if scale is None else scale)
    assert read.vocab_size == 40 and read.special == fairseq.FAIRSEQ_IDS
    expected = {'d_model': 16, 'num_heads': 2, 'd_ff': 32, 'num_encoder_layers': 2}
    expected |= {'pre_layer_norm': True, 'attention_bias': True, 'layer_norm_epsilon': 1e-5}
    if family == 'mbart':
        expected |= {'positions': 'bart_learned', 'max_positions': 20, 'ffn': 'gelu'}
        expected |= {'layernorm_embedding': True, 'logits_bias': True}
    else:
        expected |= {'positions': 'fairseq_sinusoidal', 'ffn': 'relu', 'logits_bias': False}
    assert {k: read.model[k] for k in expected} == expected


def test_generation_settings_become_eval_settings_and_the_forced_code_is_noted(tmp_path):
    """config.json's settings where there is no generation_config.json, a key it lacks from
    the config class (mBART's forced_eos_token_id 2: EOS forced at the limit);
    forced_bos_token_id given back as the first token forced; early_stopping ignored; the
    single tokens bad_words_ids bans never emitted, eos left out as generate leaves it."""
    changes = {'num_beams': 5, 'length_penalty': 0.8, 'early_stopping': True}
    changes |= {'forced_bos_token_id': 7, 'bad_words_ids': [[9], [2]]}
    read = fairseq.read(str(_directory(tmp_path, 'mbart', **changes)), weights=False)
    assert read.eval == {
        'beam_size': 5,
        'alpha': 0.8,
        'length_penalty': 'fairseq',
        'eos_at_limit': 'forced',
        'renormalize': False,
    }
    assert read.generation['forced_eos_token_id'] == (2, "mBART's config default")
    assert read.generation['early_stopping'] == (True, 'config.json')
    assert read.forced_bos == 7 and read.special.never_emit == (1, 9)
    (tmp_path / 'mbart' / 'generation_config.json').write_text('{"decoder_start_token_id": 2}')
    read = fairseq.read(str(tmp_path / 'mbart'), weights=False)  # then only that file counts
    assert read.eval['beam_size'] == 1 and read.eval['eos_at_limit'] == 'none'
    assert read.forced_bos is None and read.special.never_emit == (1,)


def _leaves(tree, prefix=''):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f'{prefix}{key}/')
        else:
            yield f'{prefix}{key}', value


def _config(family: str) -> TransformerConfig:
    model = fairseq.model_settings({**CONFIGS[family], **SHAPE}, 'config.json')
    return TransformerConfig(vocab_size=40, special=fairseq.FAIRSEQ_IDS, **model)


@pytest.mark.parametrize('family', FAMILIES)
def test_the_table_maps_every_parameter_both_ways(family):
    """Ours -> theirs -> ours gives every array back; theirs are transformers' names and
    shapes (torch's [out, in], the heads fused, final_logits_bias [1, V])."""
    cfg = _config(family)
    params = random_params(cfg)
    state = state_dict_from_params(params, cfg)
    assert state['model.encoder.layers.0.self_attn.q_proj.weight'].shape == (16, 16)
    assert state['model.decoder.layers.1.fc1.weight'].shape == (32, 16)
    assert ('final_logits_bias' in state) is (family == 'mbart')
    if family == 'mbart':
        assert state['final_logits_bias'].shape == (1, 40)
        assert state['model.decoder.embed_positions.weight'].shape == (22, 16)
    back = dict(_leaves(params_from_state_dict(state, cfg, 'here')))
    ours = dict(_leaves(params))
    assert ours.keys() == back.keys()
    for key, value in ours.items():
        np.testing.assert_array_equal(back[key], np.asarray(value, np.float32), err_msg=key)


def test_missing_or_disagreeing_tensors_stop_in_one_line():
    cfg = _config('mbart')
    state = state_dict_from_params(random_params(cfg), cfg)
    lacking = {k: v for k, v in state.items() if k != 'model.encoder.layer_norm.bias'}
    with pytest.raises(
        FairseqError, match=r'^here has no tensor model\.encoder\.layer_norm\.bias\.$'
    ):
        params_from_state_dict(lacking, cfg, 'here')
    # transformers puts zeros where final_logits_bias is not stored
    lacking = {k: v for k, v in state.items() if k != 'final_logits_bias'}
    assert not params_from_state_dict(lacking, cfg, 'here')['logits_bias'].any()
    wrong = {**state, 'model.decoder.layers.0.fc2.weight': np.zeros((16, 33), np.float32)}
    with pytest.raises(FairseqError, match=r'fc2\.weight has shape \(16, 33\), not \(16, 32\)'):
        params_from_state_dict(wrong, cfg, 'here')
    untied = {**state, 'lm_head.weight': state['model.shared.weight'] + 1}
    with pytest.raises(FairseqError, match='lm_head.weight differs from model.shared.weight'):
        params_from_state_dict(untied, cfg, 'here')


def test_a_stored_sinusoid_table_is_checked_not_read():
    cfg = _config('m2m100')
    state = state_dict_from_params(random_params(cfg), cfg)
    name = 'model.encoder.embed_positions.weights'
    table = sinusoid_rows(24, 16, 1)
    assert not table[1].any() and np.abs(table[2]).max() > 0.5
    params_from_state_dict({**state, name: table}, cfg, 'here')  # ours: read as it is
    with pytest.raises(FairseqError, match=f'^here: {name} differs from fairseq'):
        params_from_state_dict({**state, name: table[::-1].copy()}, cfg, 'here')


def test_the_export_refuses_what_the_family_cannot_hold(tmp_path):
    cfg = _config('m2m100')
    for changes, says in (
        ({'pre_layer_norm': False}, 'model.pre_layer_norm=False cannot be exported'),
        ({'logits_bias': True}, 'M2M100 has no final_logits_bias'),
    ):
        bad = dataclasses.replace(cfg, **changes)
        with pytest.raises(ExportError, match=says):
            fairseq_export.write_model(str(tmp_path), bad, 'm2m100', {})
    assert not list(tmp_path.iterdir())  # nothing written


def _families():
    """tests/model/test_fairseq_families.py: its tiny Hugging Face models of both families,
    every weight drawn (`family`), and its token drawing; it needs torch and transformers."""
    pytest.importorskip('torch', reason="torch is not installed: pip install -e '.[export]'")
    pytest.importorskip(
        'transformers', reason="transformers is not installed: pip install -e '.[export]'"
    )
    from tests.model import test_fairseq_families

    return test_fairseq_families


def _saved(tmp_path_factory, name: str, **options):
    """``name``'s Hugging Face model as ``save_pretrained(**options)`` writes it, built once."""
    model = _families().family(name)[0]
    key = '-'.join(f'{k}{v}' for k, v in options.items())
    return built_once(
        tmp_path_factory, f'fairseq-{name}{key}', lambda p: model.save_pretrained(p, **options)
    )


@pytest.mark.slow  # transformers' models are imported, built and saved
@pytest.mark.parametrize('name', FAMILIES)
def test_a_saved_directory_reads_to_hugging_faces_logits(tmp_path_factory, name):
    """The model section read from config.json is the one proven against Hugging Face's
    network (test_fairseq_families.py), and with the tensors read from model.safetensors our
    teacher-forced logits are Hugging Face's to 1e-4 on right-padded rows."""
    import jax
    import torch

    families = _families()
    model, cfg, _ = families.family(name)
    read = fairseq.read(str(_saved(tmp_path_factory, name)))
    assert dataclasses.replace(read.config(), attention_impl='einsum') == cfg
    inputs = families._tokens(0, (3, 7), lengths=[7, 4, 2])
    targets = families._tokens(1, (3, 6), lengths=[6, 3, 5])
    decoder_inputs = np.pad(targets, ((0, 0), (1, 0)), constant_values=2)[:, :-1]
    with torch.no_grad():
        want = model(
            input_ids=torch.from_numpy(inputs).long(),
            attention_mask=torch.from_numpy(inputs != 1).long(),
            decoder_input_ids=torch.from_numpy(decoder_inputs).long(),
        ).logits.numpy()
    from transformer.model import Transformer

    with jax.default_matmul_precision('float32'):
        # One program: eagerly, each operation compiles on its own.
        apply = jax.jit(Transformer(cfg).apply)
        ours = np.asarray(apply({'params': read.params}, inputs, targets))
    real = targets != 1
    assert np.abs(want[real]).max() > 1
    np.testing.assert_allclose(ours[real], want[real], atol=1e-4, rtol=0)


@pytest.mark.slow  # transformers' model is imported, built and saved three ways
def test_sharded_and_pytorch_bin_saves_read_the_same(tmp_path_factory, tmp_path):
    """save_pretrained's shards (model-0000x-of-0000y.safetensors and their index), and a
    pytorch_model.bin, whole or sharded with its index, that also holds the sinusoid tables
    an older save kept (checked against ours, not read), give the parameters
    model.safetensors gives."""
    import shutil

    import torch

    model = _families().family('m2m100')[0]
    whole = dict(_leaves(fairseq.read(str(_saved(tmp_path_factory, 'm2m100'))).params))
    sharded = _saved(tmp_path_factory, 'm2m100', max_shard_size='20KB')
    assert (sharded / 'model.safetensors.index.json').is_file()
    assert len(list(sharded.glob('model-*-of-*.safetensors'))) > 1
    state = dict(model.state_dict())
    assert 'model.encoder.embed_positions.weights' not in state  # (transformers 5 computes it)
    for stack in ('encoder', 'decoder'):
        table = getattr(model.model, stack).embed_positions.weights
        state[f'model.{stack}.embed_positions.weights'] = table
    binary, binary_shards = tmp_path / 'bin', tmp_path / 'bin_shards'
    for directory in (binary, binary_shards):
        directory.mkdir()
        shutil.copy(sharded / 'config.json', directory)
    torch.save(state, binary / 'pytorch_model.bin')
    # pytorch_model-00001-of-00002.bin ... and their index, as NLLB-200 3.3B ships them
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        shard = f'pytorch_model-0000{i + 1}-of-00002.bin'
        torch.save({n: state[n] for n in part}, binary_shards / shard)
        weight_map |= dict.fromkeys(part, shard)
    index = json.dumps({'metadata': {}, 'weight_map': weight_map})
    (binary_shards / 'pytorch_model.bin.index.json').write_text(index)
    for directory in (sharded, binary, binary_shards):
        read = dict(_leaves(fairseq.read(str(directory)).params))
        assert read.keys() == whole.keys()
        for key, value in whole.items():
            np.testing.assert_array_equal(read[key], value, err_msg=f'{directory}: {key}')


@pytest.mark.slow  # transformers' models are imported, built, saved and loaded back
@pytest.mark.parametrize('name', FAMILIES)
def test_the_export_of_a_read_directory_loads_back_with_every_tensor_equal(
    tmp_path_factory, tmp_path, name
):
    """read -> write_model -> transformers' from_pretrained: every tensor of the original
    model equal, config.json's and generation_config.json's values the directory's own, and
    the same tensor names stored."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    model = _families().family(name)[0]
    source = _saved(tmp_path_factory, name)
    read = fairseq.read(str(source))
    fairseq_export.write_model(str(tmp_path), read.config(), name, read.params, read.files)
    for file in ('config.json', 'generation_config.json'):
        assert json.loads((tmp_path / file).read_text()) == json.loads((source / file).read_text())
    stored = load_file(str(tmp_path / 'model.safetensors'))
    assert stored.keys() == load_file(str(source / 'model.safetensors')).keys()
    model_class = getattr(transformers, model.__class__.__name__)
    loaded = model_class.from_pretrained(str(tmp_path)).eval()
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key


@pytest.mark.slow  # transformers' models are imported, built and loaded back
@pytest.mark.parametrize('name', FAMILIES)
def test_the_export_of_a_model_trained_here_is_the_same_network_in_transformers(tmp_path, name):
    """Without a source directory the export writes a whole config.json of its own: loaded by
    transformers, the same weights give exactly the logits of the model they came from, and
    generation_config.json names its decoding settings."""
    import torch
    import transformers

    families = _families()
    model, cfg, params = families.family(name)
    generation = fairseq_export.generation_config(4, 1.0, forced_eos=True)
    fairseq_export.write_model(str(tmp_path), cfg, name, params, generation=generation)
    loaded = getattr(transformers, model.__class__.__name__).from_pretrained(str(tmp_path))
    assert loaded.generation_config.num_beams == 4
    assert loaded.generation_config.forced_eos_token_id == 2
    inputs = torch.from_numpy(families._tokens(2, (2, 6), lengths=[6, 3])).long()
    decoder_inputs = torch.from_numpy(families._tokens(3, (2, 5), lengths=[5, 2])).long()
    with torch.no_grad():
        want, got = (
            m.eval()(
                input_ids=inputs, attention_mask=inputs != 1, decoder_input_ids=decoder_inputs
            ).logits
            for m in (model, loaded)
        )
    assert torch.equal(got, want)
