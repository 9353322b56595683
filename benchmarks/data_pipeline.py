"""Throughput of the input pipeline: vocabulary, tokenization + cache, packed batches.

Measures, for Multi30k by default (or the synthetic task): preparing and reading the raw text,
training the SentencePiece vocabulary, tokenizing and caching the training split, reloading
the cache, packing, packed batches and tokens per second, the padding fraction (first-fit
packing and greedy packing for comparison), restoring an iterator state, and building the
evaluation batches. Prints the figures and saves them as JSON.

    .venv/bin/python benchmarks/data_pipeline.py                       # Multi30k
    .venv/bin/python benchmarks/data_pipeline.py --dataset synthetic
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
from absl import logging

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from transformer import data, schema  # noqa: E402
from transformer.data import packing, tokenized  # noqa: E402
from transformer.data import tokenizer as tokenizer_lib  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / 'shared' / 'data' / 'multi30k'


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dataset', default='multi30k', help="'multi30k' or 'synthetic'")
    parser.add_argument(
        '--manual_dir',
        default=os.environ.get('MULTI30K_DIR', str(DEFAULT_MULTI30K)),
        help='raw Multi30k files',
    )
    parser.add_argument('--vocab_size', type=int, default=8000)
    parser.add_argument('--vocab_model_type', default='bpe')
    parser.add_argument('--max_len', type=int, default=64)
    parser.add_argument('--batch_size', type=int, default=48, help='packed rows per batch')
    parser.add_argument('--num_batches', type=int, default=500)
    parser.add_argument('--workdir', default=None, help='default: a temporary directory')
    parser.add_argument(
        '--out', default=str(REPO / 'benchmarks' / 'results' / 'data_pipeline.json')
    )
    return parser.parse_args(argv)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _throughput(iterator: data.TrainIterator, num_batches: int) -> dict[str, float]:
    next(iterator)  # the first batch may pack a chunk; time the steady state
    tokens = 0
    start = time.perf_counter()
    for _ in range(num_batches):
        batch = next(iterator)
        tokens += int((batch['inputs'] > 0).sum() + (batch['targets'] > 0).sum())
    seconds = time.perf_counter() - start
    return {
        'batches_per_s': num_batches / seconds,
        'tokens_per_s': tokens / seconds,
        'rows_per_s': num_batches * iterator.batch_size / seconds,
    }


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    logging.set_verbosity(logging.WARNING)
    workdir = args.workdir or tempfile.mkdtemp(prefix='data-pipeline-')
    config = schema.default_config().data
    config.dataset = args.dataset
    config.vocab_size = args.vocab_size
    config.vocab_model_type = args.vocab_model_type
    config.max_len = args.max_len
    config.data_dir = os.path.join(workdir, 'tfds')
    if args.dataset == 'multi30k':
        config.manual_dir = args.manual_dir
        config.test_split = 'test2016'
    results = {'dataset': args.dataset, 'config': config.to_dict()}

    (sources, targets), results['prepare_and_read_text_s'] = _timed(
        lambda: data.load_text(config, 'train')
    )
    _, results['read_text_s'] = _timed(lambda: data.load_text(config, 'train'))  # prepared
    results['train_pairs'] = len(sources)

    sample = tokenizer_lib.sample_sentences(sources, targets, config.vocab_sample_size)
    _, results['vocab_training_s'] = _timed(  # SentencePiece alone, on the sampled sentences
        lambda: tokenizer_lib.train_tokenizer(
            sample,
            os.path.join(workdir, 'scratch', 'spm.model'),
            vocab_size=config.vocab_size,
            model_type=config.vocab_model_type,
        )
    )
    # What a run pays: reading the text, sampling, training, saving to the workdir.
    tokenizer, results['get_tokenizer_s'] = _timed(
        lambda: data.get_tokenizer(config, os.path.join(workdir, 'vocab', 'spm.model'))
    )
    results['vocab_size'] = tokenizer.vocab_size
    cache_dir = os.path.join(workdir, 'data_cache')

    (source_ids, _), seconds = _timed(lambda: tokenized.encode_texts(tokenizer, sources))
    (target_ids, _), more = _timed(lambda: tokenized.encode_texts(tokenizer, targets))
    results['tokenize_s'] = seconds + more
    results['train_tokens'] = int(len(source_ids) + len(target_ids))  # EOS included
    results['tokenize_tokens_per_s'] = results['train_tokens'] / results['tokenize_s']
    results['target_to_source_tokens'] = len(target_ids) / len(source_ids)

    split, results['tokenize_and_cache_s'] = _timed(  # reads the text again, tokenizes, saves
        lambda: tokenized.tokenize_split(config, tokenizer, 'train', cache_dir)
    )
    tokenized.clear_memory_cache()
    _, results['load_cached_ids_s'] = _timed(
        lambda: tokenized.tokenize_split(config, tokenizer, 'train', cache_dir)
    )

    iterator, results['make_train_iterator_s'] = _timed(
        lambda: data.make_train_iterator(
            config, tokenizer, batch_size=args.batch_size, seed=0, cache_dir=cache_dir
        )
    )
    results['packing'] = iterator.stats()
    results['throughput'] = _throughput(iterator, args.num_batches)
    greedy = data.TrainIterator(
        split, batch_size=args.batch_size, seed=0, max_len=args.max_len, open_rows=1
    )
    results['packing_greedy'] = greedy.stats()
    results['padding_by_max_len'] = {
        max_len: data.TrainIterator(split, batch_size=1, seed=0, max_len=max_len).stats()[
            'padding_fraction'
        ]
        for max_len in (32, 64, 128, 256)
    }
    results['pack_one_epoch_s'] = _timed(
        lambda: packing.pack_examples(
            split.source_lengths, split.target_lengths, args.max_len, packing.OPEN_ROWS
        )
    )[1]

    state = iterator.get_state()
    restored = data.TrainIterator(split, batch_size=args.batch_size, seed=1, max_len=args.max_len)
    _, results['restore_state_s'] = _timed(lambda: restored.set_state(state))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(next(iterator).values(), next(restored).values(), strict=True)
    )

    for split_name in (config.eval_split, config.test_split):
        batches, seconds = _timed(
            lambda s=split_name: data.make_eval_batches(
                config, tokenizer, s, batch_size=64, cache_dir=cache_dir
            )
        )
        rows = sum(int((b['index'] >= 0).sum()) for b in batches)
        real = sum(int((b['inputs'] > 0).sum() + (b['targets'] > 0).sum()) for b in batches)
        slots = sum(b['inputs'].size + b['targets'].size for b in batches)
        results[f'eval_{split_name}'] = {
            'build_s': seconds,
            'examples': rows,
            'batches': len(batches),
            'lengths': sorted({b['inputs'].shape[1] for b in batches}),
            'padding_fraction': 1 - real / slots,
        }
    results['machine'] = common.host()
    print(json.dumps(results, indent=2, default=str))
    common.write_report(args.out, results)


if __name__ == '__main__':
    main()
