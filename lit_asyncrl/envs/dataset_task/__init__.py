"""Prompt datasets with reward functions (`env=dataset`)."""
