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


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.translate --workdir DIR < in.txt > out.txt``."""
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
    define('input', flags.DEFINE_string, None, 'Input file (default: stdin).')
    define('output', flags.DEFINE_string, None, 'Output file (default: stdout).')
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir')
        console.check_paths({'input': FLAGS.input}, {'output': FLAGS.output})
        config, tokenizer, model, params, steps = _load(FLAGS)
        if FLAGS.input:
            with open(FLAGS.input, 'rb') as f:
                lines = data_lib.decode_lines(f.read(), FLAGS.input)
        else:
            lines = data_lib.decode_lines(sys.stdin.buffer.read(), 'stdin')
        logging.info('Translating %d lines with checkpoints %s.', len(lines), steps)
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
        )
        if FLAGS.nbest:
            text = format_nbest(translations)
        else:
            text = ''.join(t + '\n' for t in translations)
        if FLAGS.output:
            with open(FLAGS.output, 'w', encoding='utf-8') as f:
                f.write(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    console.run(main, argv, out_of_memory_hint=console.DECODING_OUT_OF_MEMORY)


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
        training.check_decoding(
            config,
            FLAGS.batch_size or config.eval.batch_size,
            max(beam, FLAGS.nbest),
            tokenizer.vocab_size,
            beam_flag=flag,
        )
    except (rundir.WorkdirError, data_lib.DataError, ConfigError) as e:
        raise SystemExit(f'error: {e}') from None
    return loaded


if __name__ == '__main__':
    cli()
