"""Every embedding table for its whole life: creation, placement, hot/cold tiers and prefetch,
per-table optimizers and slots, step-boundary sync, export and restore (``collection.py``)."""
