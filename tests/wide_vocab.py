"""A SentencePiece vocabulary wider than uint16's 65536 ids, built in well under a second.

A small BPE model is trained on the synthetic pair (`tests.tiny_run.data_config`) and widened
to ``size`` pieces by appending user-defined pieces ``w000500``, ``w000501``, ... (``w`` and the
piece's own id in six digits): SentencePiece matches such a piece wherever its text occurs, so
a sentence that names ``w070123`` holds id 70123. The model is a real SentencePiece file that
the project's `Tokenizer` reads as any other; only its pieces past the trained ones are made
up, which is what a multilingual model's 256k vocabulary looks like to the code that moves ids.
"""

from __future__ import annotations

import pathlib


def piece(i: int) -> str:
    """The text of the appended piece of id ``i``."""
    return f'w{i:06d}'


def wide_vocabulary(path: pathlib.Path, size: int) -> pathlib.Path:
    """Writes the widened model of ``size`` pieces at ``path`` (a ``.model`` file; the small
    trained one beside it) and returns ``path``."""
    from sentencepiece import sentencepiece_model_pb2

    from tests.tiny_run import data_config
    from transformer import data

    small = path.with_name(f'{path.stem}-small.model')
    data.get_tokenizer(data_config(), str(small))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(small.read_bytes())
    for i in range(len(proto.pieces), size):
        added = proto.pieces.add()
        added.piece, added.score = piece(i), 0.0
        added.type = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    path.write_bytes(proto.SerializeToString())
    return path
