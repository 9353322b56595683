"""Several training runs loaded as one `Ensemble` (transformer/decoding/next_token.py), which the
searches take in place of one model's parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transformer import data as data_lib
from transformer import rundir, schema
from transformer.checkpoint import load_model
from transformer.decoding.next_token import Ensemble, ensemble_params
from transformer.model import Transformer


def _decoding_config(model: Transformer):
    """The model config without its dropout rates, which do not change decoding."""
    return dataclasses.replace(
        model.config, dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0
    )


def load_ensemble(
    workdirs: Sequence[str],
    step: int | None = None,
    average_last: int | None = None,
    best: bool = False,
    *,
    shardings=None,
    scan_layers: bool | None = None,
) -> tuple[schema.Experiment, data_lib.Tokenizer, Transformer, Ensemble, list[list[int]]]:
    """Runs decoded together as one `Ensemble`.

    Every run is loaded as `load_model` loads it (the same ``step`` / ``average_last`` /
    ``best``, restored into ``shardings``: a decoding layout's, model -> shardings); they
    must share the model (dropout rates aside) and the vocabulary: train them with one
    ``data.vocab_path``. The first run's config, tokenizer and model are returned.

    Returns:
      (config, tokenizer, model, the runs' parameters as an `Ensemble`, the steps
      loaded from each run).
    """
    if not workdirs:
        raise rundir.WorkdirError('An ensemble needs at least one workdir.')
    loaded = [
        load_model(w, step, average_last, best, shardings=shardings, scan_layers=scan_layers)
        for w in workdirs
    ]
    config, tokenizer, model = loaded[0][:3]
    for other, (_, other_tokenizer, other_model, _, _) in zip(
        workdirs[1:], loaded[1:], strict=True
    ):
        if other_tokenizer.fingerprint != tokenizer.fingerprint:
            raise rundir.WorkdirError(
                f'{other} has another vocabulary than {workdirs[0]}: an ensemble decodes one '
                'vocabulary (train its runs with the same data.vocab_path).'
            )
        if _decoding_config(other_model) != _decoding_config(model):
            raise rundir.WorkdirError(
                f'{other} has another model than {workdirs[0]} ({other_model.config} vs '
                f'{model.config}): an ensemble needs one architecture.'
            )
    params = ensemble_params([params for _, _, _, params, _ in loaded])
    return config, tokenizer, model, params, [steps for *_, steps in loaded]
