"""lit_asyncrl: asynchronous RL fine-tuning of LLM agents with Lightning and vLLM."""

import logging

from lit_asyncrl.cache_dir import keep_torch_compile_cache_here
from lit_asyncrl.cpu_threads import let_idle_threads_sleep

__version__ = "0.1.0"

# vLLM's CPU build checks for Triton's CPU backend when it is imported and warns that there is none,
# before its own log level applies. That outcome is expected on CPU, so the warning stays off the
# console: here, because each engine's spawned process imports the entry point's package (this
# one) before it imports vLLM.
logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)

# Before anything imports vLLM (which makes torch's compile cache dir on import): not in /tmp.
keep_torch_compile_cache_here()
# Before anything imports torch (whose OpenMP runtime reads it once): idle threads yield the cores.
let_idle_threads_sleep()
