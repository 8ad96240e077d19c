"""Looking at trained runs: per-token quantities of trajectories as the learner
computes them, rendered as coloured HTML, a run's checkpoints, and what learner updates
do to the likelihood of solved and unsolved episodes (docs/analysis.md)."""
from sao.analysis.run_checkpoints import CheckpointedRun, experiment_config, run_config
from sao.analysis.token_html import QUANTITIES, TokenHtml, render_html
from sao.analysis.token_table import (TokenTable, dis_weights, token_spans, token_tables,
                                      token_texts)
from sao.analysis.update_probe import sequence_logprobs, update_effect

__all__ = ["CheckpointedRun", "QUANTITIES", "TokenHtml", "TokenTable", "dis_weights",
           "experiment_config", "render_html", "run_config", "sequence_logprobs", "token_spans",
           "token_tables", "token_texts", "update_effect"]
