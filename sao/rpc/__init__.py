"""gRPC protocol between the learner and the rollout fleet.

``sao.proto`` defines the ``RolloutWorker`` service; the generated stubs
(``sao_pb2``, ``sao_pb2_grpc``) are checked in and regenerated with
``python -m sao.rpc.gen``. ``codec`` converts ``sao.types.Trajectory`` to and
from wire bytes; ``auth`` holds the shared-secret token check and TLS setup;
``credentials`` where a run's token and TLS paths come from, and when a worker
must have a token.
"""
