"""T5 directories the tests build once per session (tests/shared_dirs.py `built_once`): a
SentencePiece model trained in the test with T5's ids (pad 0, eos 1, unk 2) and MADLAD-400's
``<2de>`` and ``<2fr>`` tags as pieces, written as transformers writes a T5 tokenizer."""

import random
from pathlib import Path

WORDS = (
    'the house is small and green der Hund ist gross und braun a cat sat on the mat '
    'ein Mann fährt Fahrrad im Park zwei Kinder spielen'
).split()
TAGS = ('<2de>', '<2fr>')
PIECES = 48  # the SentencePiece model's pieces


def lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [' '.join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def build_spiece(path: Path) -> None:
    """``path``/spiece.model: a unigram model of `PIECES` pieces, T5's special ids and the
    tags as user-defined pieces (ids 3 and 4)."""
    import sentencepiece as spm

    path.mkdir(parents=True)
    text = path / 'train.txt'
    text.write_text('\n'.join(lines(400)), encoding='utf-8')
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(path / 'spiece'),
        vocab_size=PIECES,
        model_type='unigram',
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        user_defined_symbols=list(TAGS),
        minloglevel=2,
    )
    text.unlink()
    (path / 'spiece.vocab').unlink()


def build_vocab_dirs(path: Path) -> None:
    """``path``/spm: spiece.model alone; ``path``/json: tokenizer.json and
    tokenizer_config.json as transformers 5's T5Tokenizer saves them."""
    import transformers

    build_spiece(path / 'spm')
    transformers.T5Tokenizer.from_pretrained(str(path / 'spm')).save_pretrained(path / 'json')
