"""Embedding sharding planner: table statistics → shards → cost model → search → placement.yaml.

The seams follow TorchRec's planner: ``spec`` (what a table and a shard are), ``shard_layouts``
(which shards a table may be cut into), ``cost_model`` (what a PS's set of shards costs per
step, fitted by ``gmeta_tf.calibration`` on real PS processes), ``search`` / ``baselines`` (who goes where)
and ``placement_file`` (the contract with the trainer).
"""
