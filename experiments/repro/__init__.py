"""The reproduction sweep: one file per arm (a config), the driver (``sweep``) and the report.

``ARMS`` lists the arms in run order with the comparison each belongs to;
``python -m experiments.repro.sweep run|status|report`` runs them (docs in
``sweep``); ``RESULTS.md`` at the repository root is the report.
"""

# (arm, comparison group, what it tests). Run order: the main table first.
ARMS = (
    ("sao", "main", "SAO"),
    ("grpo", "main", "GRPO, PPO clip-higher"),
    ("grpo_dis", "main", "GRPO + DIS"),
    ("running_mean", "main", "running-mean baseline"),
    ("sao_dis_only", "main", "SAO with DIS only"),
    ("vapo", "main", "vanilla VAPO (no DIS)"),
    ("sao_k1", "critic", "K = 1 critic update"),
    ("sao_full_critic", "critic", "full-parameter critic"),
    ("grpo_sync", "wallclock", "GRPO synchronous (tau = 0)"),
    ("sao_tau1", "staleness", "SAO, tau = 1"),
    ("sao_tau8", "staleness", "SAO, tau = 8"),
    ("grpo_tau1", "staleness", "GRPO (no DIS), tau = 1"),
    ("grpo_tau8", "staleness", "GRPO (no DIS), tau = 8"),
    ("drift_sao", "drift", "online drift, SAO"),
    ("drift_running_mean", "drift", "online drift, running mean"),
)
ARM_NAMES = tuple(a for a, _, _ in ARMS)
