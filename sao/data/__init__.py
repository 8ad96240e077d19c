"""Data for training: grain prompt pipelines and the dispatcher's prompt stream
(``sao.data.prompts``), SFT demonstrations (``sao.data.demonstrations``). Import
the submodules directly."""
