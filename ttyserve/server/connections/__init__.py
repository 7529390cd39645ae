"""One client connection: its reader and writer, its requests, its hello and heartbeat."""
