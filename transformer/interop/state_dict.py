"""A Hugging Face directory's tensors, as the hub serves them: one ``model.safetensors`` or
``pytorch_model.bin``, or either sharded (``model-00001-of-00003.safetensors`` ... listed by
``model.safetensors.index.json``'s ``weight_map``; ``pytorch_model.bin.index.json`` the same
for ``.bin`` shards, as NLLB-200 3.3B ships). Every family reads its weights here
(`read_state_dict`); what the tensors mean is the family's.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from transformer.interop.family import PretrainedError

# The weights, in the order they are looked for: whole files first, then the shard indexes.
WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')
INDEX_SUFFIX = '.index.json'


def weight_files() -> tuple[str, ...]:
    """The names looked for in a directory, in order."""
    return (*WEIGHT_FILES, *(name + INDEX_SUFFIX for name in WEIGHT_FILES))


def _load_file(file: str, error: type[PretrainedError]) -> dict[str, np.ndarray]:
    """One weights file's tensors as numpy arrays (safetensors or torch's pickle)."""
    try:
        if file.endswith('.safetensors'):
            from safetensors.numpy import load_file

            return load_file(file)
        import torch

        state = torch.load(file, map_location='cpu', weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    except ImportError as e:
        raise error(
            f'Reading {file} needs the export extra ({e.name} is not installed): '
            "pip install 'transformer[export]'."
        ) from None
    except Exception as e:  # noqa: BLE001 - safetensors and torch raise their own types
        raise error(f'{file} cannot be read ({str(e).splitlines()[0][:200]}).') from None


def _shards(index_file: str, error: type[PretrainedError]) -> dict[str, list[str]]:
    """{shard file: [tensor names]} of a shard index (its ``weight_map``)."""
    try:
        with open(index_file, encoding='utf-8') as f:
            weight_map = json.load(f).get('weight_map')
    except (OSError, ValueError, AttributeError) as e:
        raise error(f'{index_file} does not read as a shard index ({e}).') from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise error(f'{index_file} has no weight_map of tensor names to shard files.')
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or os.path.basename(shard) != shard:
            raise error(f'{index_file}: weight_map names {shard!r} for {name}, not a file name.')
        shards.setdefault(shard, []).append(name)
    return shards


def _read_sharded(index_file: str, error: type[PretrainedError]) -> dict[str, Any]:
    """The tensors of every shard an index lists, each shard read once; a shard that is
    missing, or lacks a tensor the index puts in it, is one line."""
    directory, state = os.path.dirname(index_file), {}
    for shard, names in _shards(index_file, error).items():
        file = os.path.join(directory, shard)
        if not os.path.isfile(file):
            raise error(f'{index_file} lists {shard}, which is not in {directory}.')
        tensors = _load_file(file, error)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise error(f'{file} lacks {missing[0]}, which {index_file} puts in it.')
        state.update(tensors)
    return state


def read_state_dict(
    directory: str, title: str, error: type[PretrainedError] = PretrainedError
) -> dict[str, np.ndarray]:
    """The tensors of ``directory`` as float32 numpy arrays, by their stored names, from the
    first of model.safetensors, pytorch_model.bin and their shard indexes that is there.

    Args:
      directory: the model directory.
      title: what the messages call its models ('MarianMT').
      error: the family's `PretrainedError` subclass, raised with one line.
    """
    for name in weight_files():
        file = os.path.join(directory, name)
        if os.path.isfile(file):
            break
    else:
        raise error(
            f'{directory} holds none of {", ".join(weight_files())}: the {title} '
            'weights are missing.'
        )
    if name.endswith(INDEX_SUFFIX):
        tensors = _read_sharded(file, error)
    else:
        tensors = _load_file(file, error)
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}
