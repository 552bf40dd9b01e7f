"""snapcache's version, where every layer can read it (bundles record the one that wrote them)."""

__version__ = "0.1.0"
