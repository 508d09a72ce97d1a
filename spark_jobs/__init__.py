"""Lockstep's data plane: PySpark jobs that commit one Delta version per barrier."""
