"""Model family: Qwen3 / Qwen3-MoE / Llama decoders in Flax NNX (docs/models.md)."""
from sao.models.cache import KVCache, init_cache, write_cache_row
from sao.models.config import PRESETS, ModelConfig, get_preset
from sao.models.generate import (GenerateOutput, decode_step, generate, prefill,
                                 sample_tokens)
from sao.models.logprobs import predict_values, token_logprobs, token_logprobs_and_entropy
from sao.models.sharding import (LOGICAL_AXIS_RULES, axis_rules, create_sharded,
                                 logical_to_spec, make_mesh, shard_model, unsharded_params)
from sao.models.transformer import Transformer
from sao.models.value import (ATTENTION_PARAMS_REGEX, MLP_PARAMS_REGEX,
                              TRAINABLE_CRITIC_REGEX, VALUE_HEAD_REGEX, ValueModel,
                              param_paths, path_filter)
from sao.models.chat import ChatTemplate, encode_chat, encode_message, generation_prompt
from sao.models.hf import save_pretrained
from sao.models.pretrained import from_pretrained
from sao.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_hf_tokenizer
