"""The HTTP API of `ws:` and `wss:` listeners (protocol section 13): a client of the server
it runs in, given to it by `serve` (routes.py), with its bodies' types and OpenAPI document."""
