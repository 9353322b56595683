"""What the pretrained-model benchmarks (marian_speed.py, fairseq_speed.py, t5_speed.py) share:
a command timed in a process of its own with its peak RSS, the directories a run before made,
a SentencePiece model padded with fillers to a large vocabulary, batches by length, and the
pieces an output's text was decoded from.

Nothing here imports jax or torch: Linux counts in a child's peak RSS the RSS of the process
that started it, so the process that measures stays small.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from transformer import files

REPO = pathlib.Path(__file__).resolve().parents[1]


def read(path) -> list[str]:
    with open(path, encoding='utf-8') as f:
        return f.read().splitlines()


def write(path, lines: list[str]) -> None:
    pathlib.Path(path).write_text(''.join(line + '\n' for line in lines), encoding='utf-8')


def write_json(path, value) -> None:
    pathlib.Path(path).write_text(json.dumps(value, ensure_ascii=False), encoding='utf-8')


def clear_previous(work: pathlib.Path, made: tuple[str, ...], mark: files.Mark) -> None:
    """Removes the ``made`` directories a run before left in ``work``, when each holds
    ``mark`` and nothing it does not list; else one line, and nothing is removed."""
    found = [work / name for name in made if os.path.lexists(work / name)]
    for directory in found:
        if directory.is_symlink() or mark.foreign(str(directory)) != []:
            raise SystemExit(
                f'{mark.written_by}: {directory} is not what this script made there (no '
                f'{mark.name} listing its files): remove it yourself, or give another --work.'
            )
    for directory in found:
        shutil.rmtree(directory)


def measure(name: str, command: list[str], work: pathlib.Path, no_cache: bool = False) -> dict:
    """Runs ``command`` in a process of its own (its log: WORK/NAME.log); its wall time and
    peak RSS. ``no_cache``: no persistent jax compilation cache
    (transformer/backends/compile_cache.py), so ours compiles in the command it is timed in."""
    env = {k: v for k, v in os.environ.items() if not (no_cache and 'COMPILATION_CACHE' in k)}
    env.update({'TRANSFORMER_COMPILATION_CACHE': 'off'} if no_cache else {})
    log, start = work / f'{name}.log', time.perf_counter()
    with open(log, 'w') as f:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak, not the others'
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code:
        tail = '\n'.join(read(log)[-15:])
        raise SystemExit(f'{pathlib.Path(sys.argv[0]).name}: {name} failed (exit {code}):\n{tail}')
    return {'measurement': name, 'command_s': seconds, 'peak_rss_mib': usage.ru_maxrss / 1024}


def run_child(module: str, name: str, kwargs: dict, work: pathlib.Path) -> dict:
    """`measure` of ``module``'s ``CHILDREN[name]`` run in a process of its own with
    ``kwargs`` and ``result=WORK/NAME.json``, with what it wrote there."""
    file = work / f'{name}.json'
    script = (
        f'import json, sys; from benchmarks import {module} as m; '
        'm.CHILDREN[sys.argv[1]](**json.loads(sys.argv[2]))'
    )
    command = [sys.executable, '-c', script, name, json.dumps(dict(kwargs, result=str(file)))]
    return dict(measure(name, command, work), **json.loads(file.read_text()))


def batches(lengths: list[int], size: int) -> list[list[int]]:
    """Sentence indices sorted by length, ``size`` a batch."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i : i + size] for i in range(0, len(order), size)]


def generate(
    tokenizer,
    model,
    lines: list[str],
    beam_size: int,
    batch_size: int,
    extra_length: int,
    **options,
) -> tuple[list[str], int]:
    """Hugging Face ``model.generate`` of ``lines`` by batches sorted by length, each up to its
    longest input (its tokenizer's ids, EOS included) + ``extra_length`` new tokens (``options``:
    more of generate's arguments): the texts, and the output tokens after the decoder's start
    (padding not counted)."""
    import torch

    lengths = [len(ids) for ids in tokenizer(lines)['input_ids']]
    hypotheses, tokens, pad = [''] * len(lines), 0, model.config.pad_token_id
    with torch.inference_mode():
        for batch in batches(lengths, batch_size):
            inputs = tokenizer([lines[i] for i in batch], padding=True, return_tensors='pt')
            limit = max(lengths[i] for i in batch) + extra_length
            out = model.generate(**inputs, num_beams=beam_size, max_new_tokens=limit, **options)
            for i, row in zip(batch, out[:, 1:].tolist(), strict=True):  # without the start
                tokens += sum(t != pad for t in row)
                hypotheses[i] = tokenizer.decode(row, skip_special_tokens=True)
    return hypotheses, tokens


def piece_count(text: str, pieces: set[str], longest: int) -> int:
    """The fewest ``pieces`` that spell ``text`` as SentencePiece decodes them (a known
    piece's '▁' a space, the text's first one dropped; a piece it lacks, a filler, as written):
    the pieces a random model's output was decoded from, as the ids Hugging Face and
    CTranslate2 return show (their text_pieces). A character no piece spells counts 1."""
    best = len(text) + 1
    for spelled in (text.replace(' ', '▁'), '▁' + text.replace(' ', '▁')):
        fewest = [0] * (len(spelled) + 1)
        for end in range(1, len(spelled) + 1):
            starts = range(max(0, end - longest), end - 1)
            fewest[end] = 1 + min(
                [fewest[end - 1], *(fewest[s] for s in starts if spelled[s:end] in pieces)]
            )
        best = min(best, fewest[-1])
    return best


def spm_with_fillers(lines: list[str], trained: int, pieces: int, **options) -> bytes:
    """A SentencePiece model of up to ``trained`` pieces learnt from ``lines`` (BPE unless
    ``options``, SentencePieceTrainer's, say otherwise), with fillers ('▁fill000001', ...)
    appended up to ``pieces`` in all, scored below every learnt piece and all of one length, so
    that no merge of two pieces makes one: text never encodes to them, decoding spells them.

    Raises:
      ValueError: more than ``pieces`` were learnt; its message is their number.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=trained,
        **{'model_type': 'bpe', **options}, character_coverage=0.9995,
        hard_vocab_limit=False, input_sentence_size=0, num_threads=2, minloglevel=2,
    )  # fmt: skip
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    if len(proto.pieces) > pieces:
        raise ValueError(str(len(proto.pieces)))
    lowest = min(p.score for p in proto.pieces)
    for i in range(1, pieces - len(proto.pieces) + 1):
        proto.pieces.add(piece=f'▁fill{i:06d}', score=lowest - i, type=1)
    return proto.SerializeToString()
