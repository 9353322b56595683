"""Every head's attention matrix for one sentence pair, as one figure.

``python -m transformer.visualize --workdir DIR --text "A man rides a bike." --out attention.png``

Each MultiHeadAttention sows its probabilities [B, N, T, S] as ``attention_weights`` in the
``intermediates`` collection; this runs the teacher-forced model once on (source, target),
where the target is the model's own greedy translation unless ``--target`` is given, and
draws one panel per (layer, kind, head): encoder self-attention, decoder self-attention and
decoder-encoder (cross) attention.
"""

from __future__ import annotations

import functools
import os

import jax.numpy as jnp
import numpy as np
from absl import logging

from transformer import decoding, rundir
from transformer.checkpoint import load_model
from transformer.commands import console
from transformer.data import DataError
from transformer.model import ATTENTION_MAP_KINDS, attention_maps


def plot_attention(
    maps: dict[tuple[str, int, str], np.ndarray],
    source_tokens: list[str],
    target_tokens: list[str],
    out: str,
) -> None:
    """One row per (kind, layer), one column per head; token labels on the axes.

    Decoder positions are labelled with the token each one reads, the target shifted right
    behind the start token: position t attends while predicting ``target_tokens[t]``.
    """
    decoder_tokens = ['<s>', *target_tokens[:-1]]
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows = [
        (s, i, k, label)
        for s, k, label in ATTENTION_MAP_KINDS
        for (s2, i, k2) in sorted(maps)
        if (s2, k2) == (s, k)
    ]
    num_heads = next(iter(maps.values())).shape[0]
    cell = 0.18 * max(len(source_tokens), len(target_tokens)) + 1.0
    fig, axes = plt.subplots(
        len(rows), num_heads, figsize=(cell * num_heads, cell * len(rows)), squeeze=False
    )
    for r, (stack, index, kind, label) in enumerate(rows):
        weights = maps[(stack, index, kind)]
        queries = source_tokens if stack == 'encoder' else decoder_tokens
        keys = (
            source_tokens if (stack == 'encoder' or kind == 'cross_attention') else decoder_tokens
        )
        for head in range(num_heads):
            ax = axes[r][head]
            image = ax.imshow(weights[head], cmap='viridis', vmin=0.0, vmax=1.0, aspect='auto')
            ax.set_title(f'{label} L{index} head {head}', fontsize=9)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
            ax.set_yticks(range(len(queries)), queries, fontsize=8)
            if head == 0:
                ax.set_ylabel('query (decoder)' if stack == 'decoder' else 'query (source)')
            if r == len(rows) - 1 or (stack, kind) != (rows[r + 1][0], rows[r + 1][2]):
                ax.set_xlabel('key (source)' if keys is source_tokens else 'key (decoder)')
    fig.tight_layout()
    fig.colorbar(image, ax=axes, shrink=0.6, label='attention weight')
    fig.savefig(out, dpi=100)
    plt.close(fig)


def check_out(out: str) -> None:
    """A usage error for an ``--out`` whose extension matplotlib cannot write (it failed with a
    traceback at the end, after the model was loaded and run)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    extension = os.path.splitext(out)[1][1:].lower()
    if extension and extension not in FigureCanvasAgg.get_supported_filetypes():
        console.usage_exit(f'--out={out}: cannot write .{extension} files; use .png, .pdf or .svg.')


def token_labels(tokenizer, ids) -> list[str]:
    """Axis labels: each piece's text, special tokens by name."""
    special = tokenizer.special
    names = {special.eos: '</s>', special.unk: '<unk>', special.pad: '<pad>'}
    return [names.get(int(i)) or tokenizer.decode([int(i)]) or f'<{int(i)}>' for i in ids]


def input_warnings(text: str, ids: list[int], unk: int) -> list[str]:
    """What makes a figure of ``text`` say little: no words, or pieces the vocabulary lacks
    (its unknown id ``unk``)."""
    if not text.strip():
        return ['--text is empty: the figure shows the end-of-sentence token alone.']
    unknown = sum(i == unk for i in ids)
    if unknown:
        return [f'{unknown} of the {len(ids)} pieces of --text are not in the vocabulary (<unk>).']
    return []


def cli(argv: list[str] | None = None) -> None:
    """``python -m transformer.visualize --workdir DIR --text "..." --out attention.png``."""
    from absl import flags

    define = console.define_flag
    define('workdir', flags.DEFINE_string, None, 'Directory of the training run.')
    define('text', flags.DEFINE_string, None, 'Source sentence.')
    define('target', flags.DEFINE_string, None, 'Target sentence (default: greedy translation).')
    define('out', flags.DEFINE_string, 'attention.png', 'Output image (PNG/PDF/SVG).')
    define('step', flags.DEFINE_integer, None, 'Checkpoint step to load (default: the latest).')
    FLAGS = flags.FLAGS

    def main(_):
        console.require('workdir')
        console.require('text', empty_ok=True)  # an empty one draws EOS alone, with a warning
        console.check_paths(outputs={'out': FLAGS.out})
        check_out(FLAGS.out)
        try:
            _, tokenizer, model, params, _ = load_model(
                FLAGS.workdir, FLAGS.step, average_last=1, scan_layers=False
            )
        except (rundir.WorkdirError, DataError) as e:  # DataError: a vocabulary that won't load
            raise SystemExit(f'error: {e}') from None
        source_ids = tokenizer.encode(FLAGS.text)
        eos = tokenizer.special.eos
        for warning in input_warnings(FLAGS.text, source_ids, tokenizer.special.unk):
            logging.warning(warning)
        inputs = np.array(source_ids + [eos], np.int32)
        if FLAGS.target is None:
            tokens = np.asarray(decoding.greedy_search(model, params, jnp.asarray(inputs)[None])[0])
            length = int(np.argmax(tokens == eos)) + 1 if eos in tokens else len(tokens)
            targets = tokens[:length]
        else:
            targets = np.array(tokenizer.encode(FLAGS.target, 'target') + [eos], np.int32)
        maps = attention_maps(model, params, inputs, targets)
        labels = functools.partial(token_labels, tokenizer)
        plot_attention(maps, labels(inputs), labels(targets), FLAGS.out)
        print(f'translation: {tokenizer.decode(targets.tolist())}')
        print(f'wrote {FLAGS.out} ({len(maps)} attention layers)')

    console.run(main, argv)


if __name__ == '__main__':
    cli()
