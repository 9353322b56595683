"""Training: the step and its loss (steps.py), the optimizer (optim.py), devices and hosts
(parallel.py), checkpoints saved and resumed (checkpoints.py), validation, the best
checkpoint and early stopping (validation.py, best.py), metrics (metrics.py), the config's
checks (config_checks.py) and the loop (loop.py)."""
