"""The engine profiles' terms and fit file, at their old path: sim.profiles.engines (kept while
sim/validation/published_report.py imports this name)."""
from sim.profiles.engines import (DECODE_ATTENTION_OPS, DESCRIPTIONS, ENGINES, FIT_FILE, FUSED_LAUNCHES,  # noqa: F401
                                  TERM_NAMES, TERMS, TERMS_BY_NAME, Term, check_values, decode_attention_kernel,
                                  engine_values, make_profile, prior_values, read_fit_file, register_engine,
                                  register_from_file)
