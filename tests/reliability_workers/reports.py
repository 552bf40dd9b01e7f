"""Reading the disk tier's check() report in tests."""

from __future__ import annotations

PROBLEM_FIELDS = ("missing_files", "orphan_files", "temp_files", "corrupt_files")
# What a process killed mid-write may leave behind, and check(repair=True) may clean up.
IN_FLIGHT_DEBRIS = ("orphan_files", "temp_files")


def check_problems(report: object, *, allowed: tuple[str, ...] = ()) -> list[str]:
    """Every problem the report lists, except those in the `allowed` fields."""
    problems = []
    for name in PROBLEM_FIELDS:
        if name in allowed:
            continue
        problems.extend(f"{name}: {item}" for item in getattr(report, name))
    return problems
