"""The commands around the stages: the server, the demo, status, reset, follow, maintain, the workspace acceptance run,
and the terminal's output."""
