"""Experiment configurations: one ``get_config(arg)`` file per run the paper reports."""
