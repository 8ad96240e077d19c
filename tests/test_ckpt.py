"""sao.ckpt: bit-identical resume, crash safety of saves and publishes,
restore onto another mesh, params-only publish readable by the engine."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from sao.ckpt import Checkpointer, abstract_state, latest_published, publish
from sao.learner import make_train_batch
from sao.learner.mesh import mesh_from_config
from sao.learner.state import make_optimizer, plan_state
from sao.models import Transformer, ValueModel

from learner.helpers import MODEL_CFG, one_device_mesh, random_trajs, shared_learner



def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_resume_is_bit_identical(tmp_path):
    learner = shared_learner()  # SHARED_CFG: deterministic, warm-up 1, K=2
    rng = np.random.default_rng(0)
    batches = [make_train_batch(random_trajs(4, rng, max_len=16), buckets=(16,), batch_size=4,
                                pad_id=256) for _ in range(4)]
    buffered = random_trajs(2, rng)
    states = learner.init_states()
    with Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2) as ckpt:
        for i, batch in enumerate(batches):
            if i == 2:
                ckpt.save(i, train_state=states, rng=jax.random.key(7),
                          policy_version=states.policy_version,
                          data_state={"epoch": 1, "index": 9}, buffer=buffered)
                ckpt.wait()  # before the next step donates the saved buffers
            states, _ = learner.update(states, batch)
        uninterrupted = _host(states)

        restored = ckpt.restore(target=learner.abstract_states())
    assert restored.step == 2 and restored.policy_version == 1
    assert restored.data_state == {"epoch": 1, "index": 9}
    np.testing.assert_array_equal(restored.rng, jax.random.key_data(jax.random.key(7)))
    assert [t.trajectory_id for t in restored.buffer] == [t.trajectory_id for t in buffered]
    for got, want in zip(restored.buffer, buffered):
        for name in ("tokens", "action_mask", "rollout_logprobs", "policy_version"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        assert got.reward == want.reward and got.finish == want.finish
    states = restored.train_state
    assert int(states.step) == 2
    for batch in batches[2:]:
        states, _ = learner.update(states, batch)
    for a, b in zip(_host(states), uninterrupted):
        np.testing.assert_array_equal(a, b)


def test_restore_onto_another_mesh(tmp_path):
    make_tx = lambda p: make_optimizer(p, lr=1e-3, freeze_regex=r"/attn/")  # noqa: E731
    critic = lambda: ValueModel(MODEL_CFG, rngs=nnx.Rngs(3))  # noqa: E731
    big = plan_state(critic, make_tx, mesh_from_config({"data": 2, "fsdp": 2, "tensor": 2}))
    state = big.init()
    kernel = state.params["layers"][0]["mlp"]["up_proj"]["kernel"]
    assert len(kernel.sharding.device_set) == 8 and not kernel.sharding.is_fully_replicated
    with Checkpointer(str(tmp_path), async_save=False) as ckpt:
        ckpt.save(5, train_state=state)
        small = plan_state(critic, make_tx, one_device_mesh())
        out = ckpt.restore(target=abstract_state(jax.eval_shape(small.init), small.shardings))
    kernel = out.train_state.params["layers"][0]["mlp"]["up_proj"]["kernel"]
    assert kernel.sharding.device_set == {jax.devices()[0]}
    for a, b in zip(_host(out.train_state), _host(state)):
        np.testing.assert_array_equal(a, b)
    assert out.buffer == [] and out.rng is None


def test_publish_is_atomic_and_engine_readable(tmp_path):
    model = Transformer(MODEL_CFG, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    assert latest_published(str(tmp_path)) is None
    uri1 = publish(str(tmp_path), 1, params)
    from sao.models.hf import save_pretrained
    uri2 = publish(str(tmp_path), 2, params,
                   hf_export=lambda path: save_pretrained(model, MODEL_CFG, path))
    assert latest_published(str(tmp_path)) == (2, uri2)
    assert os.path.exists(os.path.join(os.path.dirname(uri2), "hf", "config.json"))
    with pytest.raises(ValueError, match="not newer"):
        publish(str(tmp_path), 2, params)
    # What JaxEngine.load_weights does with a uri.
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
    with ocp.StandardCheckpointer() as ckptr:
        back = ckptr.restore(uri2, abstract)
    for a, b in zip(_host(back), _host(params)):
        np.testing.assert_array_equal(a, b)
    for v in (3, 4, 5):
        publish(str(tmp_path), v, params, keep=2)
    assert not os.path.exists(uri1) and sorted(os.listdir(tmp_path))[:2] == ["LATEST",
                                                                             "v0000000004"]


_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from sao.ckpt import Checkpointer, publish
    root = sys.argv[1]
    tree = {"w": np.arange(1_000_000, dtype=np.float32)}
    with Checkpointer(os.path.join(root, "ckpt"), async_save=False) as c:
        c.save(1, train_state=tree)
    publish(os.path.join(root, "pub"), 1, tree)
    print("ready", flush=True)
    big = {f"w{i}": np.full((2_000_000,), i, np.float32) for i in range(12)}
    c = Checkpointer(os.path.join(root, "ckpt"))
    while True:  # saves and publishes until killed
        for step in range(2, 1000):
            c.save(step, train_state=big)
            publish(os.path.join(root, "pub"), step, big)
""")


@pytest.mark.parametrize("delay", [0.3, 1.5])
def test_sigkill_mid_save_leaves_restorable_latest(tmp_path, delay):
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)],
                            stdout=subprocess.PIPE, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
        step = ckpt.latest_step()
        assert step is not None
        target = ({"w": jax.ShapeDtypeStruct((1_000_000,), np.float32)} if step == 1 else
                  {f"w{i}": jax.ShapeDtypeStruct((2_000_000,), np.float32) for i in range(12)})
        out = ckpt.restore(step, target=target)
        if step > 1:
            assert float(out.train_state["w11"][0]) == 11.0
    version, uri = latest_published(str(tmp_path / "pub"))
    with ocp.StandardCheckpointer() as ckptr:
        back = ckptr.restore(uri)
    assert len(back) == (1 if version == 1 else 12)


def test_keeps_newest_n_and_bytes_data_state(tmp_path):
    tree = {"w": np.arange(4, dtype=np.float32)}
    with Checkpointer(str(tmp_path), max_to_keep=2) as ckpt:
        for step in range(4):
            ckpt.save(step, train_state=tree, data_state=b"\x00grain\xff", extra={"s": step})
        ckpt.wait()
        assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
        out = ckpt.restore(target=abstract_state(tree))
    assert out.data_state == b"\x00grain\xff" and out.extra == {"s": 3}
    with Checkpointer(str(tmp_path / "x")) as ckpt:
        with pytest.raises(ValueError, match="JSON"):
            ckpt.save(0, train_state=tree, data_state={1, 2})
        with pytest.raises(FileNotFoundError):
            ckpt.restore(target=abstract_state(tree))


def test_publish_with_hf_export_is_whole_and_readable(tmp_path):
    from sao.ckpt import hf_dir
    from sao.models import from_pretrained, save_pretrained
    from sao.models.tokenizer import ByteTokenizer

    model = Transformer(MODEL_CFG, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    root = str(tmp_path / "pub")
    old_umask = os.umask(0o022)
    try:
        uri = publish(root, 1, params,
                      hf_export=lambda p: save_pretrained(params, MODEL_CFG, p, ByteTokenizer()))
    finally:
        os.umask(old_umask)
    hf = hf_dir(uri)
    assert hf == os.path.join(os.path.dirname(uri), "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(os.listdir(hf))
    # safetensors writes 0600; a server running as another user must read it.
    for dirpath, dirnames, filenames in os.walk(os.path.dirname(uri)):
        assert os.stat(dirpath).st_mode & 0o777 == 0o755, dirpath
        for name in filenames:
            assert os.stat(os.path.join(dirpath, name)).st_mode & 0o777 == 0o644, name
    _, back, tok = from_pretrained(hf)
    for a, b in zip(_host(nnx.state(back, nnx.Param)), _host(params)):
        np.testing.assert_array_equal(a, b)
    assert tok.encode("<python>1</python>") == ByteTokenizer().encode("<python>1</python>")

    # A failing export publishes nothing and leaves no temporary behind.
    def broken(path):
        os.makedirs(path)
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        publish(root, 2, params, hf_export=broken)
    with pytest.raises(RuntimeError, match="no config.json"):
        publish(root, 2, params, hf_export=os.makedirs)
    assert latest_published(root) == (1, uri)
    assert sorted(os.listdir(root)) == ["LATEST", "v0000000001"]
    # A version directory renamed but never marked (killed before the marker) is replaced.
    os.makedirs(os.path.join(root, "v0000000002", "junk"))
    uri2 = publish(root, 2, params)
    assert latest_published(root) == (2, uri2)
    assert sorted(os.listdir(os.path.dirname(uri2))) == ["params"]


_EXPORT_CHILD = textwrap.dedent("""
    import os, sys, time
    from flax import nnx
    from sao.ckpt import publish
    from sao.models import Transformer, get_preset, save_pretrained
    from sao.models.tokenizer import ByteTokenizer
    root, stage = sys.argv[1], sys.argv[2]
    cfg = get_preset("tiny", hidden_size=64, intermediate_size=128, num_heads=2,
                     num_kv_heads=1, num_layers=1)
    params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    version = 0

    def export(path):
        if version == 2 and stage == "half":  # config written, weights not yet
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w") as f:
                f.write("{}")
            print("stage", flush=True)
            time.sleep(600)
        save_pretrained(params, cfg, path, ByteTokenizer())
        if version == 2 and stage == "exported":  # export whole, not renamed yet
            print("stage", flush=True)
            time.sleep(600)

    for version in (1, 2):
        publish(root, version, params, hf_export=export)
""")


@pytest.mark.parametrize("stage", ["half", "exported"])
def test_sigkill_mid_hf_export_never_shows_a_partial_version(tmp_path, stage):
    """A publish killed while (or right after) writing its HF export leaves the
    previous version as the latest, whole; the next publish clears the debris."""
    from sao.ckpt import hf_dir
    from sao.models import from_pretrained

    root = str(tmp_path / "pub")
    proc = subprocess.Popen([sys.executable, "-c", _EXPORT_CHILD, root, stage],
                            stdout=subprocess.PIPE, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        assert proc.stdout.readline().strip() == b"stage"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    tmp, *names = sorted(os.listdir(root))
    assert names == ["LATEST", "v0000000001"]
    assert tmp.startswith(".tmp-2-")  # the killed publish, invisible to readers
    version, uri = latest_published(root)
    assert version == 1
    cfg, model, _ = from_pretrained(hf_dir(uri))
    with ocp.StandardCheckpointer() as ckptr:
        back = ckptr.restore(uri)
    ours = nnx.state(model, nnx.Param)
    for a, b in zip(_host(ours), _host(back)):
        np.testing.assert_array_equal(a, b)
    publish(root, 2, ours)
    assert sorted(os.listdir(root)) == ["LATEST", "v0000000001", "v0000000002"]
