"""Validation of kvsim's predictions (`python -m sim.validate`): references, measured folders, points, report."""
