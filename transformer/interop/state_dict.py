"""A Hugging Face directory's tensors, as the hub serves them: one ``model.safetensors`` or
``pytorch_model.bin``, or either sharded (``model-00001-of-00003.safetensors`` ... listed by
``model.safetensors.index.json``'s ``weight_map``; ``pytorch_model.bin.index.json`` the same
for ``.bin`` shards, as NLLB-200 3.3B ships). Every family reads its weights here
(`read_state_dict`, all at once; `open_state_dict`, one tensor at a time from the safetensors
files' memory maps, so a family that converts each tensor as it takes it holds about one copy
of the model, not the files' and its own); what the tensors mean is the family's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
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
    state = {}
    for file, names in _shard_files(index_file, error).items():
        tensors = _load_file(file, error)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise error(f'{file} lacks {missing[0]}, which {index_file} puts in it.')
        state.update(tensors)
    return state


class LazyTensors(Mapping):
    """The tensors of safetensors files by name, each read (float32) from its file's memory
    map when it is asked for and not kept: what `open_state_dict` gives."""

    def __init__(self, where: dict[str, str], error: type[PretrainedError]):
        self.where, self.error = where, error  # {tensor name: file}

    def __getitem__(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        file = self.where[name]
        try:
            with safe_open(file, 'numpy') as f:
                return np.asarray(f.get_tensor(name), np.float32)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own types
            raise self.error(f'{file} cannot be read ({str(e).splitlines()[0][:200]}).') from None

    def __contains__(self, name: object) -> bool:  # Mapping's would read the tensor
        return name in self.where

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def _names(file: str, error: type[PretrainedError]) -> list[str]:
    """The tensor names of a safetensors file, from its header alone."""
    try:
        from safetensors import safe_open

        with safe_open(file, 'numpy') as f:
            return list(f.keys())
    except ImportError as e:
        raise error(f'Reading {file} needs safetensors ({e.name} is not installed).') from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own types
        raise error(f'{file} cannot be read ({str(e).splitlines()[0][:200]}).') from None


def _weights_file(directory: str, title: str, error: type[PretrainedError]) -> str:
    """The first of `weight_files` in ``directory``, or one line."""
    for name in weight_files():
        file = os.path.join(directory, name)
        if os.path.isfile(file):
            return file
    raise error(
        f'{directory} holds none of {", ".join(weight_files())}: the {title} weights are missing.'
    )


def _shard_files(index_file: str, error: type[PretrainedError]) -> dict[str, list[str]]:
    """{shard path: [tensor names]} of an index, each shard there."""
    directory, found = os.path.dirname(index_file), {}
    for shard, names in _shards(index_file, error).items():
        file = os.path.join(directory, shard)
        if not os.path.isfile(file):
            raise error(f'{index_file} lists {shard}, which is not in {directory}.')
        found[file] = names
    return found


def open_state_dict(
    directory: str, title: str, error: type[PretrainedError] = PretrainedError
) -> Mapping[str, np.ndarray]:
    """`read_state_dict`'s tensors, read one at a time when asked for where the weights are
    safetensors (every shard's names checked against its index first, from the headers);
    ``.bin`` files have no memory map to read from and are read whole."""
    file = _weights_file(directory, title, error)
    if file.endswith('.bin') or file.endswith('.bin' + INDEX_SUFFIX):
        return read_state_dict(directory, title, error)
    if not file.endswith(INDEX_SUFFIX):
        return LazyTensors(dict.fromkeys(_names(file, error), file), error)
    where = {}
    for shard, names in _shard_files(file, error).items():
        held = set(_names(shard, error))
        missing = [n for n in names if n not in held]
        if missing:
            raise error(f'{shard} lacks {missing[0]}, which {file} puts in it.')
        where |= dict.fromkeys(held, shard)
    return LazyTensors(where, error)


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
    file = _weights_file(directory, title, error)
    if file.endswith(INDEX_SUFFIX):
        tensors = _read_sharded(file, error)
    else:
        tensors = _load_file(file, error)
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}
