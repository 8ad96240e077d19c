"""OpenAI-compatible chat-completions endpoint in the rollout worker (docs/rollout.md
"Harness endpoint"): a harness we did not write drives the policy, token-in/token-out.

Modules: ``messages`` (request checks), ``dialect`` (tool-call formats),
``session`` (one episode's ids), ``server`` (HTTP, token), ``episode`` (the
worker's episode function), ``reference`` (our small harness), ``mswea``
(mini-swe-agent in our sandbox), ``transcripts`` (recorded harness calls,
``python -m sao.fleet.harness_check``).
"""
from sao.fleet.endpoint.episode import HarnessResult, harness_episode_fn
from sao.fleet.endpoint.messages import RequestError
from sao.fleet.endpoint.server import Endpoint, EndpointConfig

__all__ = ["Endpoint", "EndpointConfig", "HarnessResult", "RequestError", "harness_episode_fn"]
