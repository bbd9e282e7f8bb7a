"""Engine-process hygiene: the temp dirs vLLM writes to, the reaper after a SIGKILL, and the vLLM
plugins that make the engine core fork, exit at once and leave no semaphore behind."""
