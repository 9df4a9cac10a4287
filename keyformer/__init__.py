"""keyformer package."""
