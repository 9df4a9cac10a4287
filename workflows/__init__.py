"""workflows: one-off measurement scripts that drive the project's CLIs (not a library: nothing imports them)."""
