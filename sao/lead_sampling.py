"""Held-out evaluation and value-pretraining samples in a multi-process learner.

Only process 0 (the lead) samples: its in-process ``JaxEngine`` or the
fleet (``sao.evaluation.Sampler`` / ``FleetSampler``). The other processes
still take part in what that sampling needs from all of them, at the same
point of the program (docs/multihost.md):

* in process: the actor's sharded parameters are gathered to host on every
  process (``sao.multihost.gather_to_host``), and the lead's engine samples
  with the full copy on its first local device;
* on the fleet: the version is published collectively (every process writes
  its shards; ``sao.publishing.Publisher`` returns at once where it is
  already the latest, on every process alike).

Value-pretraining trajectories then reach every process
(``sao.multihost.broadcast_trajectories``): each fits the critic on them.
With one process `LeadSampling` is the sampler itself.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import jax

from sao import multihost
from sao.types import Trajectory


class LeadSampling:
    """The lead's sampler, with the other processes' part (module doc).

    Args:
      sampler: ``Sampler`` / ``FleetSampler`` on the lead, None elsewhere.
      in_process: True for the in-process engine, False for the fleet.
      publish: the run's ``publish(states, version) -> uri`` (collective).
    """

    def __init__(self, sampler, *, in_process: bool, publish: Callable[[Any, int], str]):
        self.sampler, self.in_process, self.publish = sampler, in_process, publish
        self.lead, self.several = multihost.is_lead(), multihost.process_count() > 1

    def _states(self, states):
        """``states`` as the lead's sampler can read them (collective with several processes)."""
        if not self.several:
            return states
        if not self.in_process:
            if not self.lead:           # the publish the lead's FleetSampler may make
                self.publish(states, states.policy_version)
            return states
        params = multihost.gather_to_host(states.actor.params)
        if not self.lead:
            return None
        params = jax.device_put(params, jax.local_devices()[0])
        return states.replace(actor=states.actor.replace(params=params))

    def sample(self, states, prompts: Sequence[dict],
               temperature: float | None = None) -> list[Trajectory]:
        """The lead's trajectories of ``prompts``, on every process (collective)."""
        view = self._states(states)
        trajs = self.sampler.sample(view, prompts, temperature=temperature) if self.lead else None
        return multihost.broadcast_trajectories(trajs) if self.several else trajs

    def pass_at_1(self, states, prompts: Sequence[dict], temperature: float) -> dict[str, float]:
        """The held-out metrics on the lead; ``{}`` on the other processes (collective:
        all return once the lead has its metrics)."""
        view = self._states(states)
        metrics = self.sampler.pass_at_1(view, prompts, temperature) if self.lead else {}
        multihost.sync("evaluated")
        return metrics

    def using(self, dispatcher):
        """The lead's ``sampler.using(dispatcher)``; nothing elsewhere."""
        return self.sampler.using(dispatcher) if self.lead else contextlib.nullcontext()
