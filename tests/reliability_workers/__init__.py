"""Scripts and deterministic data shared by the reliability tests (run as subprocesses)."""
