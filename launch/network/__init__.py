"""Emulated hosts and links on one machine (``--network``): see docs/network.md.

``profile`` parses what a link is (rate, loss); ``netns`` builds it out of network namespaces,
veth pairs, a bridge and ``tc``; ``watchdog`` removes it if its owner is killed outright;
``probe`` measures what the emulation really delivers.
"""
