"""Groups of tests that `--dist loadgroup` runs on one worker."""

import pytest

#: The fast tests that import vLLM (its tool parsers, its engine arguments): on one worker, so only
#: that worker pays vLLM's import (~3 s on a 2-core machine), not both.
imports_vllm = pytest.mark.xdist_group("imports_vllm")
