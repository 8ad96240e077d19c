"""Data for training: grain prompt pipelines (``sao.data.prompts``) and SFT
demonstrations (``sao.data.sft``). Import the submodules directly."""
