"""The learner: sharded actor/critic train states, `TrainBatch`, the SAO update,
guards, mesh (docs/learner.md)."""
from sao.learner.batch import TrainBatch, make_train_batch, pick_bucket
from sao.learner.config import LearnerConfig
from sao.learner.guards import check_sharded, finite_guard
from sao.learner.mesh import (distributed_init_args, maybe_initialize_distributed,
                              mesh_from_config, shard_batch)
from sao.learner.state import ModelDef, TrainState, create_state, make_optimizer
