"""Decoding a trained model: the next-token step (next_token.py), greedy search (greedy.py),
beam search (beam.py), ensembles (ensemble.py), and lines of text in, lines out
(translation.py)."""
