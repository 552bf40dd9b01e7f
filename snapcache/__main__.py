"""`python -m snapcache` runs the `snapcache` command."""

from __future__ import annotations

from importlib import import_module

if __name__ == "__main__":
    # The command lives in the separate package snapcache_cli, which the library never imports itself.
    import_module("snapcache_cli.app").main()
