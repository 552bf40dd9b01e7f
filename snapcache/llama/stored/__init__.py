"""States in the store: the one prefix cache both paths use, its restore points, blocks and records
saved and found, reports, bundles."""
