"""What the HTTP server needs besides LangServe: request limits, error replies, access checks
and the OpenAI-compatible routes. ``server.py`` composes them into the app."""
