"""Checkpoints on disk: Orbax managers, manifests that seal each step (checksums.py), and
loading parameters back, one step or an average (store.py). Training's save/resume policy is
transformer/training/checkpoints.py."""
