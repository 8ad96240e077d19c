"""Where lag comes from (sao.fleet.lag_sources): the dispatcher stamps every
accepted answer; in-flight + queued versions add up to each trajectory's lag."""
import time

import numpy as np

from sao.fleet import lag_sources, sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.leases import Lease

from .helpers import VOCAB, good_trajectory, sim_workers


def test_in_flight_and_queued_versions_add_up_to_each_lag():
    ps = sim.lognormal_prompts(40, median=24, sigma=1.5, seed=3, max_len=600)
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=3)
    seen = []
    with sim_workers(2, max_concurrency=8) as ws, Dispatcher([w.address for w in ws], ps, cfg) as d:
        while True:
            batch = d.get_batch(timeout=60)
            if not batch:
                break
            v = d.learner_version
            m = lag_sources.lag_source_metrics(batch, v)
            seen.append(m)
            for t in batch:
                flight = t.timings[lag_sources.VERSION] - t.oldest_version()
                queued = v - t.timings[lag_sources.VERSION]
                assert flight >= 0 and queued >= 0 and flight + queued == v - t.oldest_version()
                assert t.timings[lag_sources.IN_FLIGHT] > 0
            lags = [v - t.oldest_version() for t in batch]
            np.testing.assert_allclose(m["lag/in_flight_versions"] + m["lag/queued_versions"],
                                       np.mean(lags))
            d.push_weights(v + 1, f"mem://{v + 1}")
    assert len(seen) >= 5
    assert any(m["lag/in_flight_versions"] > 0 for m in seen)     # stragglers lag in flight
    assert all(0 <= m["lag/queued_fraction"] <= 1 and m["lag/queued_s"] >= 0 for m in seen)


def test_stamp_overwrites_what_a_worker_claimed():
    t = good_trajectory("p")
    t.timings.update({lag_sources.IN_FLIGHT: -5.0, lag_sources.VERSION: 99.0,
                      lag_sources.ARRIVED: 0.0})
    lease = Lease("L1", "p", {}, None, time.monotonic() - 2.0)
    lag_sources.stamp_arrival(t, "L1", lease, 3)
    assert t.trajectory_id == "L1" and t.timings[lag_sources.VERSION] == 3.0
    assert 1.9 < t.timings[lag_sources.IN_FLIGHT] < 60 and t.timings[lag_sources.ARRIVED] > 1e9
    lag_sources.stamp_arrival(t, "L2", None, 4)
    assert lag_sources.IN_FLIGHT not in t.timings
    assert lag_sources.lag_source_metrics([good_trajectory("q")], 5) == {}
