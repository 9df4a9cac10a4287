"""workflows.gpu: the one-command GPU run of issue 8 and the step that brings its results home.

    python -m workflows.gpu.run_all                      # on the GPU machine (see workflows/gpu/README.md)
    python -m workflows.gpu.run_all --device cpu --tiny  # every stage at tiny shapes, on a CPU
    python -m workflows.gpu.ingest RESULT.tar.gz         # unpack into traces/data/h200/ for sim.validate

Modules: plan (what is measured, time caps), stages (child processes with limits), summary (CSV + printed
table), run_all (the entry), ingest.
"""
