"""The engine: its protocol, its settings, and the vLLM engine that runs in this process."""
