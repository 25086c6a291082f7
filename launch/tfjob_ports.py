"""The ports of a TFJob's pods, written once: the renderer (``k8s_render.py``) declares them,
a pod (``tfjob_pod.py``) listens on them, and the emulated hosts of ``gmeta launch local
--network`` (``emulated_hosts.py``) use them as pods do, one network namespace per host.
"""
TFJOB_PORT = 2222  # a PS's (and a worker's) TF server: the operator builds TF_CONFIG from the port named tfjob-port
RENDEZVOUS_PORT = 12355  # Horovod's Gloo rendezvous, served by worker 0
HEALTH_PORT = 2223  # a PS's readiness probe (ps/server.py: /ready)
