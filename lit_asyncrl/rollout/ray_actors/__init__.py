"""Engines and the dedicated old-logit worker as Ray actors, and their placement."""
