"""An agent program's model calls as exact trajectories (issue: agents as programs, in progress).

`conversation.py` keeps one agent episode's calls (OpenAI-style chat requests) as trajectories of exact
token ids: a call whose messages begin with what the episode was already told and answered continues
the episode's trajectory (the new messages rendered and appended, the sampled ids kept as sampled); any
other call opens a new segment. The HTTP endpoint in front of it is still to come.
"""
