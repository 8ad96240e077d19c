"""The trajectory fuzzer at full count: >= 10,000 generated wire rows through
the codec and dispatcher into the project learner's SAO update (a tiny model),
with the dispatcher's state round-tripped through JSON after every batch and
through an orbax checkpoint every 50 batches.

    .venv/bin/python benchmarks/fuzz_rows.py [--examples 300]

The rows and the checks are tests/fleet/fuzz_rows.py and
tests/fleet/test_fuzz_rows.py's ``run_rows`` (``make test`` runs a short
budget of the same): each row is trained exactly when no refusing fault was
applied, else dropped under a declared reason, counted once; any exception
or wrong outcome fails the run. Ends with one JSON line: rows, trained,
drops by reason, seconds.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=300, help="hypothesis examples of 36-50 rows")
    args = p.parse_args(argv)

    import jax
    from flax import nnx
    from hypothesis import HealthCheck, given, settings, strategies as st

    from fleet import fuzz_rows  # tests/fleet
    from fleet.test_fuzz_rows import B, TOTALS, run_rows
    from sao.ckpt import Checkpointer, abstract_state
    from sao.learner import LearnerConfig, make_train_batch
    from sao.learner.learner import Learner
    from sao.learner.mesh import mesh_from_config
    from sao.models import Transformer, get_preset

    cfg = LearnerConfig(batch_size=B, length_buckets=(fuzz_rows.MAX_LENGTH,),
                        critic_warmup_steps=1, shard_check="off", pad_id=0)
    model = get_preset("tiny", hidden_size=32, intermediate_size=64, num_heads=2,
                       num_kv_heads=1, num_layers=1)
    mesh = mesh_from_config({"data": 1}, devices=jax.devices()[:1])
    learner = Learner(cfg, mesh, lambda: Transformer(model, rngs=nnx.Rngs(0)))
    states = [learner.init_states()]

    def step(batch):
        tb = make_train_batch(batch, buckets=(fuzz_rows.MAX_LENGTH,), batch_size=B, pad_id=0)
        states[0], m = learner.update(states[0], tb)
        assert all(np.isfinite(v) for v in m.values()), m

    tmp = tempfile.mkdtemp(prefix="sao-fuzz-")
    saver = Checkpointer(os.path.join(tmp, "ckpt"), async_save=False, max_to_keep=1)
    train = {"step": np.zeros((), np.int32)}
    batches = collections.Counter()

    def checkpoint(state):
        batches["n"] += 1
        if batches["n"] % 50:
            return state
        saver.save(batches["n"], train_state=train, data_state={"dispatcher": state})
        return saver.restore(target=abstract_state(train)).data_state["dispatcher"]

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(rows=st.lists(fuzz_rows.rows(), min_size=36, max_size=50))
    def fuzz(rows):
        run_rows(rows, step, checkpoint)

    TOTALS.clear()
    t0 = time.perf_counter()
    fuzz()
    saver.close()
    drops = {k[5:]: v for k, v in sorted(TOTALS.items()) if k.startswith("drop/")}
    print(json.dumps({"benchmark": "fuzz_rows", "rows": TOTALS["rows"],
                      "trained": TOTALS["trained"], "dropped": sum(drops.values()),
                      "reasons": len(drops), "drops": drops,
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
