"""Special token ids, shared by the vocabulary, the model and decoding.

0 = padding and the decoder's start token, 1 = end of sentence, 2 = unknown; there is no
beginning-of-sentence token (the shifted-right target starts with 0, Sec. 3.1).
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
