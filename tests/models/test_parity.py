"""Logit parity with `transformers` (torch CPU, float32) in both directions:
our export loaded by transformers, and a transformers checkpoint loaded by us."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

from sao.models import from_pretrained, hf  # noqa: E402
from sao.models.config import ModelConfig  # noqa: E402
from sao.models.tokenizer import ByteTokenizer  # noqa: E402

TOL = 1e-4
_SHAPE = dict(vocab_size=272, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=16, intermediate_size=96, rope_theta=10_000.0)
CONFIGS = {
    "qwen3": ModelConfig(arch="qwen3", **_SHAPE),
    "qwen3_moe": ModelConfig(arch="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, tie_word_embeddings=True, **_SHAPE),
    "llama": ModelConfig(arch="llama", qk_norm=False, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, **_SHAPE),
}


def random_model(cfg, seed):
    """Every parameter random (norm scales 1 + noise): a mis-mapped tensor
    cannot hide behind an all-ones or all-zeros value."""
    return hf.build_model(cfg, hf.random_params(cfg, seed))


def tokens(seed=0):
    return np.random.default_rng(seed).integers(0, 272, (2, 13))


def torch_logits(tm, toks):
    with torch.no_grad():
        return tm(torch.tensor(toks)).logits.float().numpy()


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_export_loads_in_transformers_with_same_logits(arch, tmp_path):
    cfg = CONFIGS[arch]
    model = random_model(cfg, seed=1)
    hf.save_pretrained(model, cfg, str(tmp_path), tokenizer=ByteTokenizer())
    tm = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert type(tm).__name__ == hf.config_to_hf(cfg)["architectures"][0]
    toks = tokens()
    ours = np.asarray(model(jnp.asarray(toks, jnp.int32)))
    np.testing.assert_allclose(ours, torch_logits(tm.eval(), toks), atol=TOL, rtol=0)
    # transformers reads the exported tokenizer as the same byte-level tokenizer.
    ht = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "x<python>print(1)</python>é"
    assert ht.encode(text, add_special_tokens=False) == ByteTokenizer().encode(text)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_transformers_checkpoint_imports_with_same_logits(arch, tmp_path):
    cfg = CONFIGS[arch]
    hf_cfg = transformers.AutoConfig.for_model(**hf.config_to_hf(cfg))
    torch.manual_seed(0)
    tm = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # HF initialises norms to 1: randomise them too.
        for name, p in tm.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    tm.save_pretrained(str(tmp_path))
    cfg2, model, tok = from_pretrained(str(tmp_path))
    assert cfg2 == cfg and tok is None
    toks = tokens(1)
    ours = np.asarray(model(jnp.asarray(toks, jnp.int32)))
    np.testing.assert_allclose(ours, torch_logits(tm, toks), atol=TOL, rtol=0)
