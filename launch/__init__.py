"""Launchers: local multi-process, Cloud TPU VM, Slurm GPU cluster, SGLang fleet (each has --dry-run)."""
