"""T5 directories the tests build once per session (tests/shared_dirs.py `built_once`): a
SentencePiece model trained in the test with T5's ids (pad 0, eos 1, unk 2) and MADLAD-400's
``<2de>`` and ``<2fr>`` tags as pieces, written as transformers writes a T5 tokenizer."""

import random
from pathlib import Path

WORDS = (
    'the house is small and green der Hund ist gross und braun a cat sat on the mat '
    'ein Mann fährt Fahrrad im Park zwei Kinder spielen'
).split()
TAGS = ('<2de>', '<2fr>')
PIECES = 48  # the SentencePiece model's pieces


def lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [' '.join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def build_spiece(path: Path) -> None:
    """``path``/spiece.model: a unigram model of `PIECES` pieces, T5's special ids and the
    tags as user-defined pieces (ids 3 and 4)."""
    import sentencepiece as spm

    path.mkdir(parents=True)
    text = path / 'train.txt'
    text.write_text('\n'.join(lines(400)), encoding='utf-8')
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(path / 'spiece'),
        vocab_size=PIECES,
        model_type='unigram',
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        user_defined_symbols=list(TAGS),
        minloglevel=2,
    )
    text.unlink()
    (path / 'spiece.vocab').unlink()


def build_vocab_dirs(path: Path) -> None:
    """``path``/spm: spiece.model alone; ``path``/json: tokenizer.json and
    tokenizer_config.json as transformers 5's T5Tokenizer saves them."""
    import transformers

    build_spiece(path / 'spm')
    transformers.T5Tokenizer.from_pretrained(str(path / 'spm')).save_pretrained(path / 'json')


# Tiny T5ForConditionalGeneration shapes: v1.1's layout (gated tanh GELU, a head of its own,
# d_kv 6 unlike d_model / heads = 8, rows past the sentinels as T5 v1.1's 32128 for 32100
# ids) and v1.0's (ReLU, the head tied); 'v1.1_sharded' is v1.1 in two safetensors shards,
# its config.json as transformers 5 writes it (scale_decoder_outputs false, where the hub's
# v1.1 has tie_word_embeddings false).
SHAPE = dict(
    d_model=16,
    d_kv=6,
    d_ff=24,
    num_layers=2,
    num_decoder_layers=3,
    num_heads=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
    dropout_rate=0.0,
    layer_norm_epsilon=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
VERSIONS = {
    'v1.1': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False),
    'v1.0': dict(feed_forward_proj='relu', tie_word_embeddings=True),
}
PADDING_ROWS = {'v1.1': 4, 'v1.0': 0}


def _save_shards(model, directory: Path, shards: int) -> None:
    """The model's tensors (the head of its own included, which transformers 5's
    save_pretrained leaves out as tied) as the hub holds them: one model.safetensors, or
    ``shards`` files listed by model.safetensors.index.json."""
    import json

    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for key in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
        state.pop(key)  # the shared table's other names
    if model.lm_head.weight is model.shared.weight:
        state.pop('lm_head.weight')
    if shards == 1:
        save_file(state, str(directory / 'model.safetensors'), metadata={'format': 'pt'})
        return
    keys = sorted(state)
    weight_map = {}
    for n in range(shards):
        name = f'model-{n + 1:05d}-of-{shards:05d}.safetensors'
        part = {k: state[k] for k in keys[n::shards]}
        save_file(part, str(directory / name), metadata={'format': 'pt'})
        weight_map |= dict.fromkeys(part, name)
    index = {'metadata': {}, 'weight_map': weight_map}
    (directory / 'model.safetensors.index.json').write_text(json.dumps(index, indent=2))


def build_models(path: Path, vocab: Path) -> None:
    """``path``/NAME for each of v1.1, v1.0 (spiece.model beside them) and v1.1_sharded
    (tokenizer.json alone): config.json, generation_config.json and the weights, every
    weight drawn (torch seeded; the norms' scales N(1, 0.2^2), the rest N(0, 0.3^2))."""
    import json
    import shutil

    import torch
    import transformers

    for name, options in {**VERSIONS, 'v1.1_sharded': VERSIONS['v1.1']}.items():
        version = name.removesuffix('_sharded')
        directory = path / name
        shutil.copytree(vocab / ('json' if name.endswith('sharded') else 'spm'), directory)
        rows = PIECES + 100 + PADDING_ROWS[version]
        torch.manual_seed(0)
        config = transformers.T5Config(vocab_size=rows, **SHAPE, **options)
        model = transformers.T5ForConditionalGeneration(config).eval()
        if not options['tie_word_embeddings']:  # transformers 5 ties it whatever the config
            model.lm_head.weight = torch.nn.Parameter(torch.empty(rows, SHAPE['d_model']))
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                tensor.normal_(1.0, 0.2) if 'layer_norm' in key else tensor.normal_(0.0, 0.3)
        config.save_pretrained(directory)
        model.generation_config.save_pretrained(directory)
        if name == 'v1.1':  # as the hub's T5 v1.1 and MADLAD-400 configs say it
            hub = json.loads((directory / 'config.json').read_text())
            del hub['scale_decoder_outputs']  # transformers 5's name of the rescale
            hub['tie_word_embeddings'] = False
            (directory / 'config.json').write_text(json.dumps(hub, indent=2))
        _save_shards(model, directory, 2 if name.endswith('sharded') else 1)


def hf_model(directory: Path):
    """transformers' model of a T5 directory, with the head of its own where the files hold
    one (transformers 5 ties lm_head to the shared table whatever the config says)."""
    import torch
    import transformers
    from safetensors import safe_open

    model = transformers.T5ForConditionalGeneration.from_pretrained(directory).eval()
    files = sorted(directory.glob('*.safetensors'))
    for file in files:
        with safe_open(str(file), 'pt') as f:
            if 'lm_head.weight' in f.keys():
                model.lm_head.weight = torch.nn.Parameter(f.get_tensor('lm_head.weight'))
    return model


# What </s>'s output row is multiplied by (v1.1's head's, v1.0's tied table's row, its input
# embedding too) for the searches' tests: a random model's outputs rarely end; so scaled,
# some outputs of each model end before a limit of 16 tokens and some do not.
EOS_SCALE = {'v1.1': 2.0, 'v1.0': -4.0}


def eos_scaled(params, name: str):
    """A copy of the parameters of the converted run ``name`` (numpy arrays), </s>'s output
    row scaled by `EOS_SCALE`."""
    import jax
    import numpy as np

    params = jax.tree.map(np.array, params)
    if 'logits_dense' in params:
        params['logits_dense']['kernel'][:, 1] *= EOS_SCALE[name]
    else:
        params['shared_embedding']['embedding'][1] *= EOS_SCALE[name]
    return params


def hf_eos_scaled(model, name: str):
    """transformers' model of ``name`` (`hf_model`), </s>'s row of its head (v1.0's: the
    shared table) scaled by `EOS_SCALE` in place, as `eos_scaled` scales ours."""
    import torch

    with torch.no_grad():
        model.lm_head.weight[1] *= EOS_SCALE[name]
    return model


NAMES = ('v1.1', 'v1.0', 'v1.1_sharded')  # the directories of `build_models`


def t5_models(tmp_path_factory) -> Path:
    """DIR/<name> for each of `NAMES` (`build_models`), built once per test session for every
    worker (tests/shared_dirs.py); read them only."""
    from tests.shared_dirs import built_once

    vocab = built_once(tmp_path_factory, 't5_vocab', build_vocab_dirs)
    return built_once(tmp_path_factory, 't5-models', lambda p: build_models(p, vocab))


def t5_runs(tmp_path_factory) -> Path:
    """DIR/<name>: each of `t5_models` converted to a run directory, once per session."""
    from tests.cli import convert_cli
    from tests.shared_dirs import built_once

    models = t5_models(tmp_path_factory)

    def build(path):
        path.mkdir()
        for name in NAMES:
            message = convert_cli(f'--from_hf={models / name}', f'--workdir={path / name}')
            assert message is None, message

    return built_once(tmp_path_factory, 't5-runs', build)
