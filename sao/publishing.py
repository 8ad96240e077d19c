"""The learner's weights for the fleet: one ``Publisher`` per run.

Each publish writes the actor's parameters of given train states as
``sao.ckpt.publish`` version ``states.policy_version`` (orbax params, what a
``JaxEngine`` loads) and, with ``checkpoint.hf_export``, the HF export
(safetensors, ``config.json``, tokenizer files: what an SGLang server loads)
inside the same version directory, renamed into place together, so a worker
never sees half an export. Publishing a version that is already the latest
returns its uri (held-out evaluation on the fleet and the RL loop may both
ask for the version they hold). The publish directory is cleared when the
publisher is made: a crashed run may have published ahead of the checkpoint
it resumes from.
"""
from __future__ import annotations

from typing import Any, Callable

from sao import ckpt, multihost, storage
from sao.models import save_pretrained


class Publisher:
    """``publish(states, version) -> uri`` of the params checkpoint (module doc).

    Args:
      directory: publish root, local or ``gs://`` (``sao.storage``; cleared
        now; workers load only under it).
      param_state: ``param_state(states) -> nnx.State`` of the actor's parameters.
      model_cfg, tokenizer: the policy's ``ModelConfig`` and tokenizer: with
        both the HF export is written (``sao.models.save_pretrained``); with
        ``model_cfg=None`` only the orbax params.
      keep: versions kept (workers must load within ``keep`` publishes).
    """

    def __init__(self, directory: str, param_state: Callable[[Any], Any], *, model_cfg=None,
                 tokenizer=None, keep: int = 3):
        self.directory, self.param_state = directory, param_state
        self.model_cfg, self.tokenizer, self.keep = model_cfg, tokenizer, keep
        if multihost.is_lead():                    # several learner processes: one clears, all wait
            storage.rmtree(directory)
        multihost.sync("sao-publisher-cleared")

    @property
    def hf_export(self) -> bool:
        return self.model_cfg is not None

    def __call__(self, states, version: int) -> str:
        """Publishes (or finds, when it is the latest) ``version``; returns its uri.

        Raises ValueError for a version older than the latest published one;
        whatever the export raises (nothing is published then).
        """
        latest = ckpt.latest_published(self.directory)
        if latest is not None and latest[0] == int(version):
            return latest[1]
        params = self.param_state(states)
        export = None
        if self.hf_export:
            # Process 0 writes the export; with several processes it needs the whole
            # arrays, gathered by all (collective).
            host = multihost.gather_to_host(params) if multihost.process_count() > 1 else params

            def export(path: str) -> None:
                save_pretrained(host, self.model_cfg, path, self.tokenizer)
        return ckpt.publish(self.directory, int(version), params, hf_export=export, keep=self.keep)
