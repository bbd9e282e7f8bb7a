"""How a version's weights reach an engine: the routes (file, staged, vLLM's transfer API, adapters)
and what of a version an engine still needs (changed tensors, changed elements)."""
