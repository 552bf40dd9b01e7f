"""The single-context path: `CacheHook`, `attach` and `CachedLlama`, one completion's flow,
warming, and why a prompt missed."""
