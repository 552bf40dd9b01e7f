"""The commands of `snapcache`, grouped by what they need: the store alone, a model, or the machine."""
