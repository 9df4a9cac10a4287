"""Validation of kvsim's predictions (`python -m sim.validate`, a thin entry over this package's cli).

references / measured: the inputs (published rows, timing folders); points + predict: every point
predicted through the engine; noise: the measurement's own scatter; analysis: everything the report
shows, computed once (`analyse` -> `Validation`); report: formatting only (Markdown, JSON); parity_plot;
published_gpu / published_report: the published-GPU engine-profile section.
"""
