"""lit_asyncrl: asynchronous RL fine-tuning of LLM agents with Lightning and vLLM."""

__version__ = "0.1.0"
