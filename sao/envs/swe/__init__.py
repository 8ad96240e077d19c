"""SWE-style repository tasks (work in progress; see docs/envs.md)."""
