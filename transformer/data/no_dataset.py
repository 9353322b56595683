"""``data.dataset='none'``: a run that names no dataset, such as a MarianMT converted without
``--config`` (transformer.convert). Its language pair is known; its splits are not, so every
read stops in one line that says how to give it text."""

from __future__ import annotations

from typing import Any

from transformer.data.errors import DataError

KEYS: dict[str, tuple[Any, type, str]] = {}


def read(data_config: Any, split: str) -> tuple[list[str], list[str]]:
    raise DataError(
        f"This run names no dataset (data.dataset='none'), so it has no split {split!r}: "
        'evaluate it with --source FILE --reference FILE, or convert it with --config to give '
        'it a data section.'
    )


def identity(data_config: Any, split: str) -> dict[str, Any]:
    del data_config, split
    return {}
