"""The score command: the model's log-probability of given translations, one line a pair (the
scoring itself is transformer/decoding/scoring.py).

``python -m transformer.score --workdir DIR --source FILE --target FILE [--token_scores]``

Line i of the output scores line i of ``--target`` as a translation of line i of ``--source``,
tab-separated, in n-best's column order: the length-normalised score (log_prob / the run's
length penalty of the token count, ``--alpha`` and ``--length_penalty`` overriding its
config), log P(target | source) summed over the target's tokens (EOS included), the token
count; ``--token_scores`` adds each token's log-probability, separated by spaces. Checkpoints
are chosen as evaluate chooses them (``--step``, ``--average_last``, ``--best``).

A multilingual run's pair (``--source_lang``, ``--target_lang``) gives the source its code
first and the target its code first: the labels ``[tgt_code] Y </s>`` Hugging Face's
tokenizer gives, the code's own log-probability counted in log P and in the token count, as
a Hugging Face model's loss on those labels counts it (log P = -loss x tokens).
"""

from __future__ import annotations

import sys

from absl import logging

from transformer import data as data_lib
from transformer import rundir
from transformer.checkpoint import load_model
from transformer.commands import console
from transformer.decoding import decode_options, format_scores, score_pairs
from transformer.schema import ConfigError


def _read(path: str) -> list[str]:
    with open(path, 'rb') as f:
        return data_lib.decode_lines(f.read(), path)


def _load(FLAGS):
    """(config, model, params, the steps loaded, the `data.Languages` of the flags), the
    languages checked before a checkpoint is read; one ``error:`` line otherwise."""
    try:
        recorded = rundir.read_config(FLAGS.workdir)
        vocabulary = rundir.load_tokenizer(recorded, FLAGS.workdir)
        languages = data_lib.languages_of(
            *(vocabulary, FLAGS.source_lang, FLAGS.target_lang),
            source_tag=FLAGS.source_tag,
            data_config=recorded.data,
        )
        config, _, model, params, steps = load_model(
            FLAGS.workdir,
            FLAGS.step,
            FLAGS.average_last,
            FLAGS.best,
            tokenizer=vocabulary,
            scan_layers=FLAGS.scan_layers,
        )
    except (rundir.WorkdirError, data_lib.DataError, ConfigError) as e:
        raise SystemExit(f'error: {e}') from None
    return config, model, params, steps, languages


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.score --workdir DIR --source FILE --target FILE``."""
    from absl import flags

    console.define_checkpoint_flags()
    console.define_language_flags()
    console.define_penalty_flags()
    define = console.define_flag
    define('source', flags.DEFINE_string, None, 'Source sentences, one a line.')
    define('target', flags.DEFINE_string, None, 'Their translations, one a line, aligned.')
    define('output', flags.DEFINE_string, None, 'Output file (default: stdout).')
    define('token_scores', flags.DEFINE_bool, False, "Add each token's log-probability.")
    define('batch_size', flags.DEFINE_integer, None, 'Pairs per batch (default: eval.batch_size).',
           lower_bound=1)  # fmt: skip
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir', 'source', 'target')
        console.check_paths(
            {'source': FLAGS.source, 'target': FLAGS.target}, {'output': FLAGS.output}
        )
        sources, targets = _read(FLAGS.source), _read(FLAGS.target)
        if len(sources) != len(targets):
            console.usage_exit(
                f'--target={FLAGS.target} has {len(targets)} lines and --source={FLAGS.source} '
                f'{len(sources)}: give one target a source.'
            )
        config, model, params, steps, languages = _load(FLAGS)
        logging.info('Scoring %d pairs with checkpoints %s.', len(sources), steps)
        options = decode_options(
            config.eval,
            alpha=FLAGS.alpha,
            length_penalty=FLAGS.length_penalty,
            forced=languages.forced,
        )
        scores = score_pairs(
            *(model, params, languages.tokenizer, sources, targets),
            options=options,
            batch_size=FLAGS.batch_size or config.eval.batch_size,
        )
        text = format_scores(scores, FLAGS.token_scores)
        if FLAGS.output:
            with open(FLAGS.output, 'w', encoding='utf-8') as f:
                f.write(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    console.run(main, argv, out_of_memory_hint='Lower --batch_size (pairs scored at once).')


if __name__ == '__main__':
    cli()
