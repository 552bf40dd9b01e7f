"""Getting llama.cpp ready: loading a model, the build's flags and facts, the AMX and C++ runtime
checks, the demo model."""
