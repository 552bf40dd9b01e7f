"""The `snapcache` command-line interface, built on snapcache's public API only."""
