"""The translate command: translate text with a trained checkpoint, one sentence a line
(the decoding itself is transformer/decoding/translation.py).

``python -m transformer.translate --workdir DIR < in.txt > out.txt``

The sentences of each batch are split over the devices of the run's layout and over the
processes of a multi-process decode (``--coordinator_address``, ``--num_processes``,
``--process_id``), where process 0 reads the input and writes the output
(transformer/decoding/mesh.py).

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
from transformer import multihost, rundir, training
from transformer.commands import console, decoding_run
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
    """The lines of ``path`` (stdin without one), read by process 0 and broadcast."""
    read = (lambda: _read(path)) if path else sys.stdin.buffer.read
    return data_lib.decode_lines(decoding_run.read_on_main(read), path or 'stdin')


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
        decoding_run.join_processes(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.init_timeout_s
        )
        loaded = _load(FLAGS)
        config = loaded.config
        # Process 0 reads the input and the prefixes; every process decodes its rows of each
        # batch of them.
        lines = _read_lines(FLAGS.input)
        prefixes = _read_lines(FLAGS.prefix) if FLAGS.prefix else None
        if prefixes is not None and len(prefixes) != len(lines):
            console.usage_exit(
                f'--prefix={FLAGS.prefix} has {len(prefixes)} lines and the input {len(lines)}: '
                'give one prefix a line.'
            )
        logging.info('Translating %d lines with checkpoints %s.', len(lines), loaded.member_steps)
        try:
            translations = translate_lines(
                lines,
                loaded.tokenizer,
                loaded.model,
                loaded.params,
                beam_size=config.eval.beam_size if FLAGS.beam_size is None else FLAGS.beam_size,
                options=loaded.options(FLAGS.alpha, FLAGS.length_penalty),
                batch_size=FLAGS.batch_size or config.eval.batch_size,
                max_input_tokens=FLAGS.max_input_tokens or config.data.max_len,
                nbest=FLAGS.nbest,
                sampling=sampling,
                constraints=constraints,
                prefixes=prefixes,
                layout=loaded.layout,
            )
        except ValueError as e:  # a prefix too long for its line's output (before decoding)
            raise SystemExit(f'error: {e}') from None
        if multihost.is_main():  # process 0 writes every output
            _write(translations, nbest=bool(FLAGS.nbest or (sampling and sampling.num_samples > 1)))

    console.run(main, argv, out_of_memory_hint=console.DECODING_OUT_OF_MEMORY)


def _read(path: str) -> bytes:
    with open(path, 'rb') as f:
        return f.read()


def _write(translations: list, *, nbest: bool) -> None:
    from absl import flags

    text = format_nbest(translations) if nbest else ''.join(t + '\n' for t in translations)
    if flags.FLAGS.output:
        with open(flags.FLAGS.output, 'w', encoding='utf-8') as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _load(FLAGS: Any) -> decoding_run.LoadedRun:
    """The run (or the ensemble) the flags name on its decoding layout, once the search they
    ask for is known to fit (`training.check_decoding`); one ``error:`` line otherwise."""
    try:
        loaded = decoding_run.load_run(
            FLAGS.workdir,
            step=FLAGS.step,
            average_last=FLAGS.average_last,
            best=FLAGS.best,
            ensemble=FLAGS.ensemble,
            gather_params=FLAGS.gather_params,
            source_tag=FLAGS.source_tag,
            source_lang=FLAGS.source_lang,
            target_lang=FLAGS.target_lang,
            scan_layers=FLAGS.scan_layers,
            **{key: FLAGS[key].value for key in decoding_run.LAYOUT_KEYS},
        )
        config, layout = loaded.config, loaded.layout
        beam = config.eval.beam_size if FLAGS.beam_size is None else FLAGS.beam_size
        flag = '--nbest' if FLAGS.nbest > beam else '--beam_size'  # a beam of max(both)
        rows = max(beam, FLAGS.nbest)
        if FLAGS.sampling:  # N samples of an input decode as N rows, as N beams do
            rows, flag = FLAGS.num_samples or 1, '--num_samples'
        training.check_decoding(
            config,
            FLAGS.batch_size or config.eval.batch_size,
            rows,
            loaded.tokenizer.vocab_size,
            devices=layout.local_devices,
            beam_flag=flag,
            data_shards=layout.data_shards,
        )
    except (rundir.WorkdirError, data_lib.DataError, ConfigError) as e:
        raise SystemExit(f'error: {e}') from None
    return loaded


if __name__ == '__main__':
    cli()
