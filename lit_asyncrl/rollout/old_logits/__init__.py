"""Exact pi_old for tokens still in the system: scoring them, and the dedicated old-logit worker."""
