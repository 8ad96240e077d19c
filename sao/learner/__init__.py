"""The learner: sharded actor/critic train states, `TrainBatch`, the SAO update,
guards, mesh (docs/learner.md)."""
from sao.learner.batch import TrainBatch, make_train_batch, pick_bucket
from sao.learner.config import LearnerConfig
from sao.learner.guards import check_sharded, finite_guard
from sao.learner.learner import Learner
from sao.learner.mesh import distributed_init_args, maybe_initialize_distributed, mesh_from_config
from sao.learner.state import LearnerStates, ModelDef, TrainState, make_optimizer, plan_state
from sao.learner.update import gae_targets, outcome_targets, to_host

__all__ = [
    "Learner", "LearnerConfig", "LearnerStates", "ModelDef", "TrainBatch", "TrainState",
    "check_sharded", "distributed_init_args", "finite_guard", "gae_targets",
    "outcome_targets", "make_optimizer", "make_train_batch", "maybe_initialize_distributed",
    "mesh_from_config", "pick_bucket", "plan_state", "to_host",
]
