"""The run's publisher (sao/publishing.py, ``sao.components.publisher``).

With ``checkpoint.hf_export`` every publish carries the HF export SGLang
servers load (it used to be read nowhere: no export was ever written and a
server was asked to load a ``<version>/hf`` that did not exist); the export
round-trips through ``from_pretrained``; the latest version asked again
gives its uri; an SGLang fleet without exports is refused at start.
"""
import dataclasses
import os

import numpy as np
import pytest
from flax import nnx

from experiments import sao_math
from sao import components
from sao.ckpt import hf_dir, latest_published
from sao.models import Transformer, from_pretrained, get_preset
from sao.models.hf import model_params
from sao.models.tokenizer import ByteTokenizer


@dataclasses.dataclass
class States:
    params: object
    policy_version: int


class Learner:
    """What the publisher uses of a learner: the actor's params as an nnx.State."""

    class actor_def:
        @staticmethod
        def param_state(params):
            return params


def states(model, version):
    s = States(nnx.state(model, nnx.Param), version)
    s.actor = s  # the publisher reads states.actor.params
    return s


CFG = dataclasses.replace(get_preset("tiny"), num_layers=1)


def config(**overrides):
    cfg = sao_math.get_config("cpu")
    cfg.unlock()
    for key, value in overrides.items():
        group, name = key.split(".")
        cfg[group][name] = value
    return cfg


def test_each_publish_carries_the_hf_export(tmp_path):
    publish_dir = str(tmp_path / "publish")
    os.makedirs(os.path.join(publish_dir, "v0000000007"))  # left by a crashed run: cleared
    publish = components.publisher(config(**{"checkpoint.hf_export": True}), Learner, CFG,
                                   ByteTokenizer(), publish_dir)
    models = [Transformer(CFG, rngs=nnx.Rngs(seed)) for seed in (0, 1)]
    uri0 = publish(states(models[0], 0), 0)
    assert publish(states(models[0], 0), 0) == uri0  # the latest again: same uri, no new files
    uri1 = publish(states(models[1], 1), 1)
    assert latest_published(publish_dir) == (1, uri1)
    assert not os.path.exists(os.path.join(publish_dir, "v0000000007"))
    for uri, model in ((uri0, models[0]), (uri1, models[1])):
        files = set(os.listdir(hf_dir(uri)))
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
        _, loaded, tok = from_pretrained(hf_dir(uri))
        ours, theirs = model_params(model), model_params(loaded)
        assert ours.keys() == theirs.keys()
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
        assert tok.vocab_size == ByteTokenizer().vocab_size
    with pytest.raises(ValueError, match="not newer"):
        publish(states(models[0], 0), 0)


def test_without_hf_export_only_params_and_sglang_needs_it(tmp_path):
    publish = components.publisher(config(**{"checkpoint.hf_export": False}), Learner, CFG,
                                   ByteTokenizer(), str(tmp_path / "p"))
    uri = publish(states(Transformer(CFG, rngs=nnx.Rngs(0)), 0), 0)
    assert os.path.isdir(uri) and not os.path.exists(hf_dir(uri))
    with pytest.raises(ValueError, match="needs checkpoint.hf_export"):
        components.publisher(config(**{"checkpoint.hf_export": False, "rollout.engine": "sglang"}),
                             Learner, CFG, ByteTokenizer(), str(tmp_path / "q"))


def test_evaluation_runs_on_the_fleet_for_sglang_engines():
    assert components.samples_on_fleet(config(**{"rollout.engine": "sglang"}))
    assert not components.samples_on_fleet(config())
    assert components.samples_on_fleet(config(**{"eval.where": "fleet"}))
    with pytest.raises(ValueError, match="needs an in-process JaxEngine"):
        components.samples_on_fleet(config(**{"rollout.engine": "sglang", "eval.where": "learner"}))
    with pytest.raises(ValueError, match="eval.where must be one of"):
        components.samples_on_fleet(config(**{"eval.where": "gpu"}))
