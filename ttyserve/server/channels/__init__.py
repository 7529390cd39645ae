"""What attaches to a session: the writer's channel, and channels that watch."""
