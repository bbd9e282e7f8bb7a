"""Episodes: the runner that plays one against an engine, the formats that turn it into tokens (raw
text, chat template, tool calls), and the replay of an episode that was in flight at a checkpoint."""
