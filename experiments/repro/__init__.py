"""The reproduction sweep: one file per arm (a config), the driver (``sweep``) and the report.

``ARMS`` lists the arms in run order with the comparison each belongs to (an
arm's group decides its seeds, ``base.seeds_of``);
``python -m experiments.repro.sweep run|status|report`` runs them (docs in
``sweep``); ``RESULTS.md`` at the repository root is the report. The rest:
``PREREGISTRATION.md`` (endpoints, seeds, decision rule, fixed before the
runs) and ``claims`` (the same as code), ``results`` (reading runs, the rule
and the detectable effect), ``verdicts`` / ``report`` (RESULTS.md),
``records`` (the committed ``runs/`` folder of finished runs of clean
commits), ``progress`` (``sweep status``: percent done, ETA).

A new arm: a file here, an ``ARMS`` entry with its group, and, when it tests
a claim, a ``claims.Claim`` (and a row of PREREGISTRATION.md's table, before
its runs).
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
