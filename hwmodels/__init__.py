"""hwmodels package."""
