"""A sequence's state as bytes: captured and restored, its layout, cut into blocks and assembled
back, and the buffers it passes through (pinned memory on a GPU)."""
