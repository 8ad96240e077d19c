"""The learner: sharded actor/critic train states, `TrainBatch`, the SAO update,
guards, mesh (docs/learner.md)."""
from sao.learner.batch import TrainBatch, make_train_batch, pick_bucket
from sao.learner.config import LearnerConfig
from sao.learner.guards import check_sharded, finite_guard
from sao.learner.learner import Learner, LearnerStates, to_host
from sao.learner.mesh import (distributed_init_args, maybe_initialize_distributed,
                              mesh_from_config, shard_batch)
from sao.learner.state import (ModelDef, TrainState, create_state, make_optimizer,
                               plan_state)
from sao.learner.update import gae_targets, outcome_targets, sao_update, value_pretrain

__all__ = [
    "Learner", "LearnerConfig", "LearnerStates", "ModelDef", "TrainBatch", "TrainState",
    "check_sharded", "create_state", "distributed_init_args", "finite_guard", "gae_targets",
    "outcome_targets", "make_optimizer", "make_train_batch", "maybe_initialize_distributed",
    "mesh_from_config", "pick_bucket", "plan_state", "sao_update", "shard_batch", "to_host",
    "value_pretrain",
]
