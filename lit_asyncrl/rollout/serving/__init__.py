"""The rollout service on vLLM engines, and what coordinates it: lanes, routing, placement, DDP,
held-out evaluation, start-up checks and statistics."""
