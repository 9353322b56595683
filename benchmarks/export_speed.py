"""Translation speed and BLEU: CTranslate2 (float32, int8) against our own decoding, on CPU.

One trained run, exported with ``transformer.export``, translates the same Multi30k test2016
sentences with beam 4 three ways: our translate path (jax, the ``transformer.translate``
command's code), CTranslate2 float32 and CTranslate2 int8. Ours is run twice and the second
run is timed (the first compiles one program per batch shape; its time is saved too); each
CTranslate2 model translates a few sentences before it is timed. Both use every core
(``--threads``). The beam searches are not the same: ours normalises scores by the run's
``eval.length_penalty`` (GNMT's ((5 + length) / 6)^alpha for configs/multi30k.py) and limits
outputs to input length + 50 tokens, CTranslate2 divides by length^alpha and is given the
export's fixed limit (``data.max_len`` + ``eval.extra_length`` tokens), so BLEU may differ a
little even in float32 (greedy outputs that end before either limit are identical;
tests/test_export.py). Both are written as our translate command writes a line (single
spaces). Prints the figures and saves them as JSON.

    python benchmarks/export_speed.py --workdir runs/m30k_800 --step 800
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from transformer import decoding, schema  # noqa: E402

DATA = REPO.parent / 'shared' / 'data' / 'multi30k'


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', required=True, help='a trained Multi30k run')
    parser.add_argument('--step', type=int, default=None, help='one checkpoint (default: avg)')
    parser.add_argument('--average_last', type=int, default=None)
    parser.add_argument('--source', default=str(DATA / 'test2016.en'))
    parser.add_argument('--reference', default=str(DATA / 'test2016.de'))
    parser.add_argument('--beam_size', type=int, default=4)
    parser.add_argument('--batch_size', type=int, default=64, help='sentences per batch')
    parser.add_argument('--threads', type=int, default=os.cpu_count() or 1)
    parser.add_argument('--out', default=str(REPO / 'benchmarks' / 'results' / 'export_speed.json'))
    return parser.parse_args(argv)


def _read_lines(path: str) -> list[str]:
    with open(path, encoding='utf-8') as f:
        return [line.strip() for line in f]


def _ours(args, lines, config, tokenizer, model, params) -> tuple[list[str], dict]:

    def run():
        start = time.perf_counter()
        out = decoding.translate_lines(
            lines,
            tokenizer,
            model,
            params,
            beam_size=args.beam_size,
            options=decoding.decode_options(config.eval),
            batch_size=args.batch_size,
            max_input_tokens=config.data.max_len,  # as the translate command's default
        )
        return out, time.perf_counter() - start

    _, first = run()
    hypotheses, seconds = run()
    return hypotheses, {'seconds': seconds, 'first_run_seconds_with_compilation': first}


def _ctranslate2(
    args, lines, directory: str, compute_type: str, max_decoding_length: int
) -> tuple[list[str], dict]:
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(directory, 'source.spm'))
    translator = ctranslate2.Translator(
        directory, device='cpu', compute_type=compute_type, intra_threads=args.threads
    )
    options = dict(
        beam_size=args.beam_size,
        max_batch_size=args.batch_size,
        suppress_sequences=[['<pad>']],  # id 0 starts the decoder and is never an output
        max_decoding_length=max_decoding_length,  # CTranslate2's default is 256
    )

    def run(batch):
        start = time.perf_counter()
        sources = [[*sp.encode(line, out_type=str), '</s>'] for line in batch]
        results = translator.translate_batch(sources, **options)
        # One line with single spaces, as our translate path writes it (an unknown word's
        # ' ⁇ ' would otherwise keep spaces of its own).
        out = [' '.join(sp.decode(r.hypotheses[0]).split()) for r in results]
        return out, time.perf_counter() - start

    run(lines[: args.batch_size])
    hypotheses, seconds = run(lines)
    return hypotheses, {'seconds': seconds, 'compute_type': compute_type}


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    args = _parse_args(argv)
    from transformer import export
    from transformer.evaluation import bleu_scores

    lines, references = _read_lines(args.source), _read_lines(args.reference)
    config, tokenizer, model, params, steps = export.load_run(
        args.workdir, args.step, args.average_last
    )
    load_before = os.getloadavg()  # other jobs on the machine make the timings noisy
    hypotheses, results = {}, {}
    hypotheses['ours'], results['ours'] = _ours(args, lines, config, tokenizer, model, params)
    # The exports' fixed output limit (generation_config.json's max_length less the start
    # token); ours is input length + eval.extra_length per sentence.
    max_output_tokens = config.data.max_len + config.eval.extra_length
    with tempfile.TemporaryDirectory() as tmp:
        for name, quantization in (('ctranslate2_float32', None), ('ctranslate2_int8', 'int8')):
            directory = os.path.join(tmp, name)
            export.export(
                args.workdir,
                directory,
                step=args.step,
                average_last=args.average_last,
                format='ctranslate2',
                quantization=quantization,
            )
            compute_type = 'int8' if quantization else 'float32'
            hypotheses[name], results[name] = _ctranslate2(
                args, lines, directory, compute_type, max_output_tokens
            )
    for name, result in results.items():
        scores = bleu_scores(
            hypotheses[name],
            references,
            target_lang=config.data.target_lang,
            lowercase_tokenized=config.eval.lowercase_tokenized,
            compound_split=config.eval.compound_split,
        )
        pairs = list(zip(hypotheses[name], hypotheses['ours'], strict=True))
        same = sum(a == b for a, b in pairs)
        # Outputs that go on where ours stopped: ours reached its limit (input length + 50)
        # without an EOS, where the export's limit is longer.
        longer = sum(a != b and a.startswith(b) for a, b in pairs)
        lengths = [len(tokenizer.encode(h)) + 1 for h in hypotheses[name]]
        result.update(
            sentences_per_s=len(lines) / result['seconds'],
            mean_output_tokens=sum(lengths) / len(lengths),  # EOS included
            sacrebleu=scores['sacrebleu'],
            tokenized_bleu=scores['tokenized_bleu'],
            tokenized_bleu_convention=scores['tokenized_bleu_convention'],
            identical_to_ours=same,
            differing_that_extend_ours=longer,
        )
        print(
            f'{name:>20}: {result["sentences_per_s"]:7.1f} sentences/s  '
            f'sacreBLEU {result["sacrebleu"]:5.2f}  '
            f'tokenized BLEU {result["tokenized_bleu"]:5.2f}  '
            f'{result["mean_output_tokens"]:.1f} tokens/output  '
            f'{same}/{len(lines)} outputs identical to ours ({longer} others extend ours)'
        )
    report = {
        'workdir': os.path.abspath(args.workdir),
        'steps': steps,
        'model': schema.to_dict(config)['model'],
        'sentences': len(lines),
        'source': args.source,
        'beam_size': args.beam_size,
        'alpha': config.eval.alpha,
        'batch_size': args.batch_size,
        'threads': args.threads,
        **common.host(),
        'load_average_1min_before_after': [load_before[0], os.getloadavg()[0]],
        'results': results,
    }
    common.write_report(args.out, report)


if __name__ == '__main__':
    main()
