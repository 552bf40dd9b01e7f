"""May a state be reused here: the fingerprint of a model and context, its adapters, the measured
split alignment, the Llamas that cannot be restored exactly, and the exactness chosen."""
