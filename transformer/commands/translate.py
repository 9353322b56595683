"""The translate command: translate text with a trained checkpoint, one sentence a line
(the decoding itself is transformer/decoding/translation.py).

``python -m transformer.translate --workdir DIR < in.txt > out.txt``

Progress and warnings go to stderr, translations to stdout: output line i is the translation
of input line i, or with ``--nbest K`` the K best hypotheses of each non-blank line as
tab-separated rows. What each line holds (blank lines, long lines, invalid UTF-8, the n-best
columns) is in transformer/decoding/translation.py's docstring.
"""

from __future__ import annotations

import sys
from typing import Any

from absl import logging

from transformer import data as data_lib
from transformer import decoding, rundir, training
from transformer.checkpoint import load_model
from transformer.commands import console
from transformer.decoding import format_nbest, translate_lines
from transformer.schema import ConfigError


def _define_flags() -> None:
    from absl import flags

    console.define_decoding_flags()
    define = console.define_flag
    define(
        'max_input_tokens',
        flags.DEFINE_integer,
        None,
        'Longer input lines are cut to this many tokens (default: data.max_len).',
        lower_bound=2,
    )
    define(
        'nbest',
        flags.DEFINE_integer,
        0,
        'Write the K best hypotheses of each line as tab-separated rows: line_index (from 0), '
        'rank (1 = best), score (log-prob / length penalty), log_prob, text. 0 = one '
        'translation per line.',
        lower_bound=0,
    )
    define(
        'prefix',
        flags.DEFINE_string,
        None,
        'File of target prefixes, one a line aligned with the input: each output starts with '
        'its line (an empty line: no prefix).',
    )
    define('input', flags.DEFINE_string, None, 'Input file (default: stdin).')
    define('output', flags.DEFINE_string, None, 'Output file (default: stdout).')


def _read_lines(path: str | None) -> list[str]:
    if path:
        with open(path, 'rb') as f:
            return data_lib.decode_lines(f.read(), path)
    return data_lib.decode_lines(sys.stdin.buffer.read(), 'stdin')


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.translate --workdir DIR < in.txt > out.txt``."""
    from absl import flags

    _define_flags()
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir')
        console.check_paths(
            {'input': FLAGS.input, 'prefix': FLAGS.prefix}, {'output': FLAGS.output}
        )
        sampling, constraints = console.search_settings()
        if sampling is not None and FLAGS.nbest:
            console.usage_exit(
                '--nbest lists come from beam search; --sampling draws --num_samples.'
            )
        config, tokenizer, model, params, steps = _load(FLAGS)
        lines = _read_lines(FLAGS.input)
        prefixes = _read_lines(FLAGS.prefix) if FLAGS.prefix else None
        if prefixes is not None and len(prefixes) != len(lines):
            console.usage_exit(
                f'--prefix={FLAGS.prefix} has {len(prefixes)} lines and the input {len(lines)}: '
                'give one prefix a line.'
            )
        logging.info('Translating %d lines with checkpoints %s.', len(lines), steps)
        try:
            translations = translate_lines(
                lines,
                tokenizer,
                model,
                params,
                beam_size=config.eval.beam_size if FLAGS.beam_size is None else FLAGS.beam_size,
                alpha=config.eval.alpha if FLAGS.alpha is None else FLAGS.alpha,
                length_penalty=FLAGS.length_penalty or config.eval.length_penalty,
                extra_length=config.eval.extra_length,
                batch_size=FLAGS.batch_size or config.eval.batch_size,
                max_input_tokens=FLAGS.max_input_tokens or config.data.max_len,
                nbest=FLAGS.nbest,
                sampling=sampling,
                constraints=constraints,
                prefixes=prefixes,
            )
        except ValueError as e:  # a prefix too long for its line's output (before decoding)
            raise SystemExit(f'error: {e}') from None
        _write(translations, nbest=bool(FLAGS.nbest or (sampling and sampling.num_samples > 1)))

    console.run(main, argv, out_of_memory_hint=console.DECODING_OUT_OF_MEMORY)


def _write(translations: list, *, nbest: bool) -> None:
    from absl import flags

    text = format_nbest(translations) if nbest else ''.join(t + '\n' for t in translations)
    if flags.FLAGS.output:
        with open(flags.FLAGS.output, 'w', encoding='utf-8') as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _load(FLAGS: Any) -> tuple:
    """The run (or the ensemble) the flags name, once the search they ask for is known to
    fit (`training.check_decoding`); one ``error:`` line otherwise."""
    try:
        if FLAGS.ensemble:
            loaded = decoding.load_ensemble(
                [FLAGS.workdir, *FLAGS.ensemble], FLAGS.step, FLAGS.average_last, FLAGS.best
            )
        else:
            loaded = load_model(FLAGS.workdir, FLAGS.step, FLAGS.average_last, FLAGS.best)
        config, tokenizer = loaded[:2]
        beam = config.eval.beam_size if FLAGS.beam_size is None else FLAGS.beam_size
        flag = '--nbest' if FLAGS.nbest > beam else '--beam_size'  # a beam of max(both)
        rows = max(beam, FLAGS.nbest)
        if FLAGS.sampling:  # N samples of an input decode as N rows, as N beams do
            rows, flag = FLAGS.num_samples or 1, '--num_samples'
        training.check_decoding(
            config, FLAGS.batch_size or config.eval.batch_size, rows, tokenizer.vocab_size,
            beam_flag=flag,
        )  # fmt: skip
    except (rundir.WorkdirError, data_lib.DataError, ConfigError) as e:
        raise SystemExit(f'error: {e}') from None
    return loaded


if __name__ == '__main__':
    cli()
