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

# Round two (experiments/repro/mech.py: bf16 engine, straggling and failing tools, fixed
# held-out critic evaluation, mixed-style drift warm start). The drift arms warm-start
# differently: they run in their own runs directory with ``--sft_arm m_drift_sao``.
MECH_ARMS = (
    ("m_sao", "m_main", "SAO"),
    ("m_grpo", "m_main", "GRPO, PPO clip-higher (no DIS)"),
    ("m_grpo_dis", "m_main", "GRPO + DIS"),
    ("m_vapo", "m_main", "vanilla VAPO (no DIS)"),
    ("m_sao_k1", "m_critic", "K = 1 critic update"),
    ("m_sao_full_critic", "m_critic", "full-parameter critic"),
    ("m_sao_no_pretrain", "m_critic", "no value pretraining"),
    ("m_grpo_sync", "m_wallclock", "GRPO synchronous (tau = 0)"),
    ("m_drift_sao", "m_drift", "online drift, SAO"),
    ("m_drift_running_mean", "m_drift", "online drift, running mean"),
)
MECH_ARM_NAMES = tuple(a for a, _, _ in MECH_ARMS)
