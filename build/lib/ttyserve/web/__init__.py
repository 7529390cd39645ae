"""The browser carriage (protocol section 8): the HTTP front door, the WebSocket transport,
and the terminal page with its assets (`static/`)."""
