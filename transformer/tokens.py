"""Special token ids: `SpecialIds`, the value every vocabulary gives (its ``special``,
transformer/data/vocabulary.py), and the joint SentencePiece vocabulary's own.

The joint vocabulary's (transformer/data/tokenizer.py, `JOINT`): 0 = padding and the decoder's
start token, 1 = end of sentence, 2 = unknown; there is no beginning-of-sentence token (the
shifted-right target starts with 0, Sec. 3.1). Another family's vocabulary may put its padding,
end of sentence and unknown pieces anywhere and start the decoder from a token that is not the
padding one (NLLB-200 starts from its ``</s>``). A run records its vocabulary's ids in
config.json (the ``data`` section's ``pad_id`` ... ``never_emit``), and the model
(`TransformerConfig.special`), the data pipeline, the loss and every search read them from
there; `PAD_ID`, `EOS_ID` and `UNK_ID` are only the joint tokenizer's.
"""

from __future__ import annotations

import dataclasses

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The ids that mean something to the model and the searches.

    Attributes:
      pad: padding: masked in attention, the loss and the scores; fills batches and outputs
        after EOS.
      eos: end of sentence: ends every source and target, stops a search.
      unk: a piece the vocabulary does not hold.
      decoder_start: the decoder's first input (the shifted-right target starts with it);
        it is not an output of the search and may equal pad (the joint vocabulary) or eos
        (NLLB-200's ``</s>``).
      never_emit: ids no search may output (pad, always; a vocabulary's banned words).
    """

    pad: int
    eos: int
    unk: int
    decoder_start: int
    never_emit: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, 'never_emit', tuple(sorted({*self.never_emit, self.pad})))
        if len({self.pad, self.eos, self.unk}) < 3:
            raise ValueError(
                f'pad_id={self.pad}, eos_id={self.eos} and unk_id={self.unk} must be three '
                'different ids.'
            )
        if self.eos in self.never_emit:
            raise ValueError(f'never_emit holds eos_id={self.eos}: a search must end.')
        ids = (self.pad, self.eos, self.unk, self.decoder_start, *self.never_emit)
        if any(type(i) is not int or i < 0 for i in ids):
            raise ValueError(f'special ids must be integers >= 0, got {ids}.')

    def largest(self) -> int:
        """The largest id named here (a vocabulary must hold more)."""
        return max(self.pad, self.eos, self.unk, self.decoder_start, *self.never_emit)


# The joint SentencePiece vocabulary's (transformer/data/tokenizer.py): pad 0 (also the
# decoder's start, Sec. 3.1's shifted-right target), eos 1, unk 2.
JOINT = SpecialIds(pad=PAD_ID, eos=EOS_ID, unk=UNK_ID, decoder_start=PAD_ID, never_emit=(PAD_ID,))
