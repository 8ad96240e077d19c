from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("tokens", "action_mask", "rollout_logprobs", "policy_version", "reward", "finish", "prompt_id", "trajectory_id", "metadata_json", "timings", "epoch", "group")
    class TimingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTION_MASK_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    tokens: Array
    action_mask: Array
    rollout_logprobs: Array
    policy_version: Array
    reward: float
    finish: str
    prompt_id: str
    trajectory_id: str
    metadata_json: str
    timings: _containers.ScalarMap[str, float]
    epoch: int
    group: int
    def __init__(self, tokens: _Optional[_Union[Array, _Mapping]] = ..., action_mask: _Optional[_Union[Array, _Mapping]] = ..., rollout_logprobs: _Optional[_Union[Array, _Mapping]] = ..., policy_version: _Optional[_Union[Array, _Mapping]] = ..., reward: _Optional[float] = ..., finish: _Optional[str] = ..., prompt_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., metadata_json: _Optional[str] = ..., timings: _Optional[_Mapping[str, float]] = ..., epoch: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "prompt_id", "prompt_json", "temperature")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_JSON_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt_id: str
    prompt_json: str
    temperature: float
    def __init__(self, lease_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., prompt_json: _Optional[str] = ..., temperature: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("leases", "cancel_lease_ids")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    CANCEL_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    cancel_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., cancel_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("lease_id", "trajectory", "error")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    trajectory: bytes
    error: str
    def __init__(self, lease_id: _Optional[str] = ..., trajectory: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("finished", "worker_version", "worker_id")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    finished: _containers.RepeatedCompositeFieldContainer[Finished]
    worker_version: int
    worker_id: str
    def __init__(self, finished: _Optional[_Iterable[_Union[Finished, _Mapping]]] = ..., worker_version: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("version", "uri")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    version: int
    uri: str
    def __init__(self, version: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("ok", "version", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    version: int
    error: str
    def __init__(self, ok: _Optional[bool] = ..., version: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("worker_id", "version", "active_episodes", "max_concurrency", "completed", "failed", "generated_tokens", "uptime_s", "healthy", "unusable", "refused_updates")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_EPISODES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    UNUSABLE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_UPDATES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    version: int
    active_episodes: int
    max_concurrency: int
    completed: int
    failed: int
    generated_tokens: int
    uptime_s: float
    healthy: bool
    unusable: str
    refused_updates: int
    def __init__(self, worker_id: _Optional[str] = ..., version: _Optional[int] = ..., active_episodes: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., uptime_s: _Optional[float] = ..., healthy: _Optional[bool] = ..., unusable: _Optional[str] = ..., refused_updates: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[Array]
    def __init__(self, sequences: _Optional[_Iterable[_Union[Array, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("ok", "version", "logprobs", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    version: int
    logprobs: _containers.RepeatedCompositeFieldContainer[Array]
    error: str
    def __init__(self, ok: _Optional[bool] = ..., version: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[Array, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...
