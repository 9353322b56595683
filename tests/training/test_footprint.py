"""transformer/training/footprint.py: the bound's logits term, and the compiled step checked
against the memory the process may still take (`room`, `step_refusal`)."""

import dataclasses

import jax
import pytest

from tests.fairseq_models import NLLB_600M_CONFIG
from transformer import configs, schema
from transformer.backends import host_memory
from transformer.training import footprint

GiB = 2**30


def _experiment(name: str = 'tiny', **train) -> schema.Experiment:
    config = schema.parse(configs.load(name))
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **train))


class _Device:
    """An accelerator that reports its memory."""

    platform, device_kind, process_index = 'gpu', 'NVIDIA H100', 0

    def __init__(self, limit, in_use=0):
        self._stats = {'bytes_limit': limit, 'bytes_in_use': in_use}

    def memory_stats(self):
        return self._stats


def test_the_bound_counts_the_logits_and_their_gradient_once_the_vocabulary_is_known():
    base = _experiment('base')
    rows, length = base.train.batch_size, base.data.max_len
    assert footprint.LOGITS not in footprint.needs(base, 1)  # data.vocab_size is only a ceiling
    size, settings = footprint.needs(base, 1, vocab_size=37000)[footprint.LOGITS]
    assert size == rows * length * 37000 * 8
    assert 'train.batch_size=104' in settings and 'train.loss_chunk_tokens=0' in settings
    # Split over 4 data-parallel devices and 2 micro-batches: a device holds 1/8 of the rows.
    accum = _experiment('base', grad_accum_steps=2)
    assert footprint.needs(accum, 4, 37000)[footprint.LOGITS][0] == size // 8
    chunked = _experiment('base', loss_chunk_tokens=4096)
    assert footprint.LOGITS not in footprint.needs(chunked, 1, vocab_size=37000)
    devices = [_Device(size - 1)]
    with pytest.raises(schema.ConfigError, match=r'the logits and their gradient alone need'):
        footprint.check(base, devices, vocab_size=37000)
    footprint.check(base, devices)  # without the vocabulary's size, no logits term
    footprint.check(chunked, devices, vocab_size=37000)


def test_the_embeddings_count_once_the_vocabulary_is_known_and_grow_with_it():
    """configs/base.py shares one [V, D] table (Sec. 3.4): 4 float32 copies (value, gradient,
    Adam's two moments) of V x D; the logits add rows x T x 8 bytes a piece; a 2-way model
    axis halves both (it splits the vocabulary)."""
    base = _experiment('base')
    rows, length, d = base.train.batch_size, base.data.max_len, base.model.d_model
    assert footprint.EMBEDDINGS not in footprint.needs(base, 1)
    for vocab in (8000, 37000, 256206):
        parts = footprint.needs(base, 1, vocab_size=vocab)
        assert parts[footprint.EMBEDDINGS][0] == 4 * 4 * vocab * d
        assert parts[footprint.LOGITS][0] == rows * length * vocab * 8
        assert f'{vocab} pieces' in parts[footprint.EMBEDDINGS][1]
    untied = dataclasses.replace(
        base, model=dataclasses.replace(base.model, share_embeddings='none')
    )
    assert footprint.needs(untied, 1, 37000)[footprint.EMBEDDINGS][0] == 3 * 4 * 4 * 37000 * d
    model_2 = _experiment('base', parallelism='sharding', model_parallelism=2)
    halves = footprint.needs(model_2, 2, vocab_size=37000)
    assert halves[footprint.EMBEDDINGS][0] == 4 * 4 * 37000 * d // 2
    assert halves[footprint.LOGITS][0] == rows * length * 37000 * 8 // 2
    with pytest.raises(schema.ConfigError, match=r"the embeddings with their gradient and Adam's"):
        footprint.check(base, [_Device(4 * 4 * 256206 * d - 1)], vocab_size=256206)


def test_a_600m_nllb_model_counts_its_checkpoints_parameters():
    """The model section that converting NLLB-200-distilled-600M gives (pre-LN, biased
    attention, final norms, fairseq's sinusoids, one tied table): the bound's weights are 4
    copies of its float32 checkpoint, 615,073,792 parameters counted here by hand, the
    embedding's 262M of them counted only once the vocabulary is known."""
    from transformer.interop import fairseq_config

    config = configs.load('base')
    config.model.update(fairseq_config.model_settings(NLLB_600M_CONFIG, 'config.json'))
    config.data.vocab_size = v = NLLB_600M_CONFIG['vocab_size']
    experiment = schema.parse(config)
    d, f, layers = 1024, 4096, 12
    attention = 4 * (d * d + d)  # query, key, value, output: kernels and biases
    ffn, norm = d * f + f + f * d + d, 2 * d
    encoder = attention + ffn + 2 * norm
    decoder = 2 * attention + ffn + 3 * norm
    params = layers * (encoder + decoder) + v * d + 2 * norm  # + the table, the final norms
    assert params == 615_073_792
    parts = footprint.needs(experiment, 1, vocab_size=v)
    weights = parts["the layers' weights with their gradient and Adam's moments"][0]
    assert weights + parts[footprint.EMBEDDINGS][0] == 4 * (4 * params)  # 4 checkpoints' bytes
    assert parts[footprint.EMBEDDINGS][0] == 4 * 4 * (v * d + 2 * norm)
    assert footprint.EMBEDDINGS not in footprint.needs(experiment, 1)


@pytest.mark.parametrize('name', configs.names())
def test_the_bound_passes_every_shipped_config_on_a_24_gib_host(name, monkeypatch):
    """The documented CPU commands run on a 24 GiB host: the bound with the logits must not
    refuse them (nor base / big, whose step the compiled check judges)."""
    monkeypatch.setattr(footprint, 'host_bytes', lambda: 24 * GiB)
    experiment = _experiment(name)
    footprint.check(experiment, jax.devices('cpu')[:1], vocab_size=experiment.data.vocab_size)


def test_room_of_an_accelerator_is_its_least_limit_minus_what_it_holds():
    devices = [_Device(80 * GiB, 10 * GiB), _Device(80 * GiB, 30 * GiB)]
    assert footprint.room(devices) == (
        50 * GiB,
        'NVIDIA H100 memory (its limit minus what it holds)',
    )
    assert footprint.room([_Device(None)]) == (None, '')


def test_room_of_the_cpu_is_what_the_host_lets_this_process_take(monkeypatch):
    monkeypatch.setattr(host_memory, 'available', lambda: (3 * GiB, 'MemAvailable'))
    assert footprint.room(jax.devices('cpu')[:1]) == (3 * GiB, 'host memory (MemAvailable)')
    monkeypatch.setattr(host_memory, 'available', lambda: None)
    assert footprint.room(jax.devices('cpu')[:1]) == (None, '')


@dataclasses.dataclass
class _Stats:
    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int


class _Compiled:
    def __init__(self, stats):
        self._stats = stats

    def memory_analysis(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def _tiny_step(state_gib: float, temp_gib: float) -> _Compiled:
    """A compiled step of configs/tiny.py (32 rows of 64 tokens) whose state takes
    ``state_gib`` (donated: the new state reuses it) and temporaries ``temp_gib``."""
    batch = 32 * 64 * 4 * 6  # six int32 [rows, max_len] arrays
    state = int(state_gib * GiB)
    return _Compiled(_Stats(state + batch, state, state, int(temp_gib * GiB)))


def test_a_compiled_step_past_the_room_is_refused_naming_the_batch_that_would_fit(monkeypatch):
    monkeypatch.setattr(host_memory, 'available', lambda: (5 * GiB, 'MemAvailable'))
    experiment, cpu = _experiment(), jax.devices('cpu')
    assert footprint.step_refusal(experiment, _tiny_step(1, 4), cpu[:1]) is None
    first, detail = footprint.step_refusal(experiment, _tiny_step(1, 9), cpu[:1]).split('\n')
    # 1 GiB grows with nothing, 8 with the rows: (4.5 - 1) / 8 of the 32 rows fit.
    assert first == (
        'Out of memory for the training step (9.0 GiB needed, 4.5 GiB left): lower '
        'train.batch_size=32 to 14.'
    )
    assert detail.startswith('train.batch_size=32 x data.max_len=64 x ')
    assert 'temporaries 9.0 GiB' in detail
    assert 'more than 4.5 GiB, 90% of the 5.0 GiB of host memory (MemAvailable)' in detail
    assert 'train.loss_chunk_tokens=4096' in detail and 'train.grad_accum_steps' in detail
    assert "set model.remat='full' (now 'none'" in detail
    full = dataclasses.replace(
        experiment, model=dataclasses.replace(experiment.model, remat='full')
    )
    _, detail = footprint.step_refusal(full, _tiny_step(1, 9), cpu[:1]).split('\n')
    assert 'model.remat' not in detail  # what it would suggest is already so
    # Every CPU device of the process takes its share of the same host memory.
    two = _experiment(batch_size=32)
    assert footprint.step_refusal(two, _tiny_step(0, 3), cpu[:2]) is not None
    assert footprint.step_refusal(two, _tiny_step(0, 3), cpu[:1]) is None
    # Nothing left even for the state: no batch size is offered, the other remedies are.
    first, detail = footprint.step_refusal(experiment, _tiny_step(6, 9), cpu[:1]).split('\n')
    assert first.endswith('left): shrink the model, no train.batch_size fits beside its state.')
    assert 'train.grad_accum_steps' in detail


@pytest.mark.parametrize('state_gib', [1, 6000])
def test_the_refusal_is_one_short_line_and_the_detail_goes_to_the_log(
    state_gib, monkeypatch, caplog
):
    """At the widest figures (a batch of a million rows, thousands of GiB), with a batch size
    to offer and without one: the first line stays within `REFUSAL_CHARS`, and the train
    command's error (`stops.check_memory`, printed after ``error: ``) within 200 characters,
    one line naming memory and train.batch_size; the figures go to the log."""
    from transformer.training import stops

    monkeypatch.setattr(host_memory, 'available', lambda: (5555 * GiB, 'MemAvailable'))
    experiment = _experiment(batch_size=1_000_000)
    step = _tiny_step(state_gib, 9999)
    first = footprint.step_refusal(experiment, step, jax.devices('cpu')[:1]).split('\n')[0]
    assert len(first) <= footprint.REFUSAL_CHARS, first
    with caplog.at_level('ERROR'), pytest.raises(stops.TrainingError) as info:
        stops.check_memory(experiment, step, jax.devices('cpu')[:1])
    line = f'error: {info.value}'
    assert len(line) <= 200 and '\n' not in line, line
    assert line.startswith('error: Out of memory') and 'train.batch_size' in line
    # A 6000 GiB train state leaves no room for any row of the 4999.5 GiB the step may take.
    assert ('lower train.batch_size=1000000 to ' in line) == (state_gib == 1)
    assert ('shrink the model' in line) == (state_gib != 1)
    logged = [r.getMessage() for r in caplog.records]
    assert any("XLA's memory analysis" in m and 'temporaries 9,999.0 GiB' in m for m in logged)


def test_a_cpu_step_may_take_90_percent_of_the_host_an_accelerators_all_of_its_room(
    monkeypatch,
):
    """On a CPU the kernel kills a process that goes past the memory it was granted, so a
    tenth stays free; an accelerator's allocator refuses in one line, so all of it counts."""
    monkeypatch.setattr(host_memory, 'available', lambda: (10 * GiB, 'MemAvailable'))
    step = _tiny_step(0, 9.5)
    assert footprint.step_refusal(_experiment(), step, jax.devices('cpu')[:1]) is not None
    gpu = [_Device(10 * GiB)]
    assert footprint.step_refusal(_experiment(), step, gpu) is None
    line = footprint.step_refusal(_experiment(), _tiny_step(0, 11), gpu)
    assert 'more than the 10.0 GiB of NVIDIA H100 memory (its limit minus what it' in line


@pytest.mark.parametrize('stats', [None, NotImplementedError('no analysis')])
def test_no_figure_from_xla_or_the_system_refuses_nothing(stats, monkeypatch):
    monkeypatch.setattr(host_memory, 'available', lambda: (1, 'MemAvailable'))
    cpu = jax.devices('cpu')[:1]
    assert footprint.step_refusal(_experiment(), _Compiled(stats), cpu) is None
    monkeypatch.setattr(host_memory, 'available', lambda: None)
    assert footprint.step_refusal(_experiment(), _tiny_step(1, 9), cpu) is None
