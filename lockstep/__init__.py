"""Lockstep's composition root: the ``lockstep`` command and the demo.

It imports every layer (the coordinator's client and worker, the local dev stack, the Spark
data plane) and nothing imports it. Run it as ``lockstep ...`` or ``python -m lockstep ...``.
"""
