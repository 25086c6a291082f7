"""``gmeta plan calibrate``: measure PS step cost on real local PS processes, fit the cost model.

Above ``launch`` (it starts a PS) and ``model`` / ``meta`` (its client builds the trainer's
tables and optimizers); the pure planner in ``gmeta_tf.plan`` only reads the fitted model.
"""
