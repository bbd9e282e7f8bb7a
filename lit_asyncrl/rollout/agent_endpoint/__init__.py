"""An OpenAI-compatible chat endpoint over a run's engine, for agent programs (issue: agents as programs, in progress).

- `conversation.py`: one agent episode's calls as trajectories of exact token ids: a call whose messages
  begin with what the episode was already told and answered continues the trajectory (the new messages
  rendered and appended, the sampled ids kept as sampled); any other call opens a new segment;
- `requests.py`: what a request may ask (the run's sampling settings, never others);
- `server.py`: `AgentEndpoint`, the HTTP server on the engine's loop, one URL per episode.

Not yet wired into a run: the agent-program task and the rollout service's use of it are still to come.
"""
