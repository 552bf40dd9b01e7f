"""`snapcache serve`: an OpenAI-compatible local server whose prompts survive restarts.

Needs llama-cpp-python's server extra (`pip install 'snapcache[server]'`).
"""

from __future__ import annotations

from snapcache.server.app import ServeOptions, create_app, serve
from snapcache.server.context_size import SERVE_N_CTX, serve_context_size
from snapcache.server.middleware import SCOPE_HEADER

__all__ = ["SCOPE_HEADER", "SERVE_N_CTX", "ServeOptions", "create_app", "serve", "serve_context_size"]
