"""Training: the step and its loss (steps.py), the optimizer (optim.py), devices and hosts
(parallel.py), checkpoints (transformer/checkpoint/), validation, the best
checkpoint and early stopping (validation.py, best.py), metrics (metrics.py), the config's
checks (config_checks.py) and the loop (loop.py)."""
