"""``gmeta tune``: Optuna search over config keys, scored on the valid split."""
