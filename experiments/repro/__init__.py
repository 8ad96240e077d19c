"""The reproduction sweep: one file per arm (a config), the driver (``sweep``) and the report.

``ARMS`` lists the arms the sweep runs (round two: ``m_*``, each a round-one
arm with the mechanisms of ``mech``), in run order, with the comparison each
belongs to (an arm's group decides its seeds, ``base.seeds_of``) and the SFT
warm start it shares (``SFT_OF``; default ``DEFAULT_SFT``);
``python -m experiments.repro.sweep run|status|report`` runs them (docs in
``sweep``); ``RESULTS.md`` at the repository root is the report. The rest:
``PREREGISTRATION.md`` (endpoints, seeds, decision rule, fixed before the
runs) and ``claims`` (the same as code), ``results`` (reading runs, the rule
and the detectable effect), ``verdicts`` / ``report`` (RESULTS.md),
``records`` (the committed ``runs/`` folder of finished runs of clean
commits), ``progress`` (``sweep status``: percent done, ETA), ``pilot`` (the
pilot's reading of a run, docs/repro_pilot.md), ``holdout`` (runs of seeds
outside the sweep against the spread it reports).

``ROUND_ONE_ARMS`` are the first sweep's arms (no mechanisms): still runnable
with ``--arms``, no longer part of the sweep, the claims or the report.

A new arm: a file here, an ``ARMS`` entry with its group, and, when it tests
a claim, a ``claims.Claim`` (and a row of PREREGISTRATION.md's table, before
its runs).
"""

# (arm, comparison group, what it tests). Run order: the main table first.
ARMS = (
    ("m_sao", "main", "SAO"),
    ("m_grpo", "main", "GRPO, PPO clip-higher (no DIS)"),
    ("m_grpo_dis", "main", "GRPO + DIS"),
    ("m_vapo", "main", "vanilla VAPO (no DIS)"),
    ("m_sao_k1", "critic", "K = 1 critic update"),
    ("m_sao_full_critic", "critic", "full-parameter critic"),
    ("m_sao_no_pretrain", "critic", "no value pretraining"),
    ("m_grpo_sync", "wallclock", "GRPO synchronous (tau = 0)"),
    ("m_drift_sao", "drift", "online drift, SAO"),
    ("m_drift_running_mean", "drift", "online drift, running mean"),
)
ARM_NAMES = tuple(a for a, _, _ in ARMS)

# Round one (no mechanisms; its RESULTS.md stays until regenerated).
ROUND_ONE_ARMS = (
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
ROUND_ONE_ARM_NAMES = tuple(a for a, _, _ in ROUND_ONE_ARMS)
ALL_ARMS = ARMS + ROUND_ONE_ARMS

# The SFT warm start an arm shares (the arm whose config trains it): the drift arms
# demonstrate every answer style (``mech.DRIFT_STYLE_MIX``), so they have their own.
DEFAULT_SFT = "m_sao"
SFT_OF = {"m_drift_sao": "m_drift_sao", "m_drift_running_mean": "m_drift_sao"}


def sft_arm_of(arm: str) -> str:
    """The arm whose config trains ``arm``'s SFT warm start (``SFT_OF``, else ``DEFAULT_SFT``)."""
    return SFT_OF.get(arm, DEFAULT_SFT)


def group_of(arm: str) -> str:
    """``arm``'s comparison group (``ARMS`` or ``ROUND_ONE_ARMS``); raises KeyError."""
    return {a: g for a, g, _ in ALL_ARMS}[arm]
