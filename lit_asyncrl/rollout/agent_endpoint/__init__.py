"""An OpenAI-compatible chat endpoint over a run's engines, for agents written as programs (docs/agents.md).

- `conversation.py`: one agent episode's calls as trajectories of exact token ids: a call whose messages
  begin with what the episode was already told and answered continues the trajectory (the new messages
  rendered and appended, the sampled ids kept as sampled); any other call opens a new segment;
- `requests.py`: what a request may ask (the run's sampling settings, never others);
- `server.py`: `AgentEndpoint`, the HTTP server on a thread of its own, one URL per episode, each call
  sampled on its episode's engine loop; external agents claim episodes and post outcomes there;
- `connections.py`: how agents reach it (the loopback socket, kept out of forked processes; in-process
  clients through httpx's ASGI transport); `responses.py`: answers in OpenAI's format, whole or streamed;
- `episodes.py`: one episode of an agent task (`AgentProgramEnv`, `ExternalAgentEnv`) as the producer
  plays it: the agent's outcome as the reward, its failures as counted drop reasons.
"""
