"""Hot/cold embedding split: the most-looked-up rows replicated on every worker (see README)."""
