"""The ports of a TFJob's pods and the variables that move them, written once: the renderer
(``k8s_render.py``) declares them, a pod (``tfjob_pod.py``) listens on them, and the emulated hosts
of ``gmeta launch local --network`` (``emulated_hosts.py``) use them as pods do, one network
namespace per host. A variable's name is spelled here alone, so the pod that reads it and the
launcher or manifest that sets it cannot drift apart.
"""
TFJOB_PORT = 2222  # a PS's (and a worker's) TF server: the operator builds TF_CONFIG from the port named tfjob-port
RENDEZVOUS_PORT = 12355  # Horovod's Gloo rendezvous, served by worker 0
HEALTH_PORT = 2223  # a PS's readiness probe (ps/server.py: /ready)
POD_IFACE = "eth0"  # what a pod (and an emulated host) calls its network interface: the Gloo ring's

RENDEZVOUS_PORT_ENV = "GMETA_RENDEZVOUS_PORT"  # a pod's RENDEZVOUS_PORT, when set
HEALTH_PORT_ENV = "GMETA_HEALTH_PORT"  # a PS pod's HEALTH_PORT, when set
GLOO_IFACE_ENV = "GMETA_GLOO_IFACE"  # the interface a worker pod's Gloo ring uses (POD_IFACE unless set)
