"""sao.analysis.token_html: one span per token, colours from the colormap, observation
boxes, DIS marks, escaping and the legend, on a hand-made `TokenTable`."""
import html.parser

import numpy as np
import pytest
from matplotlib import colormaps, colors

from sao.analysis import QUANTITIES, TokenTable, render_html, token_spans
from sao.models.tokenizer import ByteTokenizer
from sao.types import Trajectory

TOK = ByteTokenizer()
# "Q\n" prompt, "<python>1</python>" action, "<output>\x00</output>" observation, "A<eos>" action.
TOKENS = [ord("Q"), 10, 259, ord("1"), 260, 261, 0, 262, ord("A"), 258]
MASK = np.array([0, 0, 1, 1, 1, 0, 0, 0, 1, 1], bool)
ADV = np.where(MASK, [0, 0, 2.0, -1.0, 0.5, 0, 0, 0, -0.5, 1.0], 0.0).astype(np.float32)
RATIO = np.where(MASK, [1, 1, 1.0, 0.5, 1.2, 1, 1, 1, 7.0, 1.0], np.nan).astype(np.float32)


def _table(eps_low=0.3, eps_high=5.0):
    n = len(TOKENS)
    traj = Trajectory(tokens=np.array(TOKENS), action_mask=MASK,
                      rollout_logprobs=np.where(MASK, -1.0, 0.0), policy_version=np.array(
                          [0, 0, 1, 1, 1, 2, 2, 2, 2, 2]), reward=1.0, finish="stop",
                      prompt_id="p", trajectory_id="t<1>")
    spans = token_spans(MASK)
    low = MASK & (RATIO <= 1 - eps_low)
    high = MASK & (RATIO >= 1 + eps_high)
    cols = {"position": np.arange(n), "tokens": traj.tokens,
            "span": np.array([k for k, a, b in spans for _ in range(a, b)]),
            "span_index": np.array([j for j, (k, a, b) in enumerate(spans) for _ in range(a, b)]),
            "action_mask": MASK, "policy_mask": MASK, "policy_version": traj.policy_version,
            "staleness": np.where(MASK, 4 - traj.policy_version, 0),
            "rewards": np.eye(n, dtype=np.float32)[-1], "values": np.linspace(-1, 1, n),
            "advantages": ADV, "returns": np.where(MASK, 1.0, 0.0), "logprobs": np.full(n, -1.0),
            "rollout_logprobs": traj.rollout_logprobs, "ratio": RATIO,
            "dis_weight": np.where(MASK & ~low & ~high, RATIO, 0.0),
            "dis_masked_low": low, "dis_masked_high": high}
    return TokenTable(traj, cols, spans, 4, eps_low, eps_high)


class _Spans(html.parser.HTMLParser):
    """Token spans as ``(classes, style, text)`` and the observation boxes' token positions."""

    def __init__(self):
        super().__init__()
        self.tokens, self.boxes, self._stack = [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "").split()
        if tag == "span" and "tok" in cls:
            self.tokens.append([cls, a.get("style", ""), "", a.get("title", "")])
            if self.boxes and self._stack and self._stack[-1] == "box":
                self.boxes[-1].append(int(a["data-t"]))
        if tag == "span" and "observation-span" in cls:
            self.boxes.append([])
        self._stack.append("box" if "observation-span" in cls else "tok" if "tok" in cls else tag)

    def handle_endtag(self, tag):
        self._stack.pop()

    def handle_data(self, data):
        if self._stack and self._stack[-1] == "tok":
            self.tokens[-1][2] += data


def _parse(view):
    p = _Spans()
    p.feed(str(view))
    return p


def _background(style):
    return next((s.split(":", 1)[1] for s in style.split(";") if s.startswith("background:")), None)


def test_one_span_per_token_with_kinds_and_boxes():
    view = render_html(_table(), TOK)
    p = _parse(view)
    assert len(p.tokens) == len(TOKENS)
    kinds = [next(k for k in ("prompt", "action", "observation") if k in c) for c, *_ in p.tokens]
    assert kinds == ["prompt"] * 2 + ["action"] * 3 + ["observation"] * 3 + ["action"] * 2
    assert p.boxes == [[5, 6, 7]]                   # the observation span is boxed
    texts = [t for _, _, t, _ in p.tokens]
    assert texts == ["Q", "↵\n", "<python>", "1", "</python>", "<output>", "\\x00", "</output>",
                     "A", "<eos>"]
    assert "\x00" not in view                      # control bytes are shown escaped
    assert "&lt;python&gt;" in view and "t&lt;1&gt;" in view    # escaped, header included
    assert view._repr_html_() == str(view)


def test_colours_follow_the_colormap():
    cmap = colormaps[QUANTITIES["advantages"][0]]
    p = _parse(render_html(_table(), TOK, color_by="advantages"))
    bg = [_background(s) for _, s, _, _ in p.tokens]
    assert bg[0] is None and bg[1] is None and bg[5] is None        # prompt, observation
    assert bg[2] == colors.to_hex(cmap(1.0))                        # A = +2 = max |A|
    assert bg[3] == colors.to_hex(cmap(0.25))                       # A = -1 -> (−1/2 + 1)/2
    p = _parse(render_html(_table(), TOK, color_by="advantages", vmax=4.0))
    assert _background(p.tokens[2][1]) == colors.to_hex(cmap(0.75))
    # ratio: log scale, centre 1, ends at the band edges (0.7 and 6.0).
    cmap = colormaps[QUANTITIES["ratio"][0]]
    p = _parse(render_html(_table(), TOK, color_by="ratio"))
    assert _background(p.tokens[2][1]) == colors.to_hex(cmap(0.5))  # ratio 1
    assert _background(p.tokens[8][1]) == colors.to_hex(cmap(1.0))  # 7 > 6: saturated
    assert _background(p.tokens[3][1]) == colors.to_hex(cmap(0.0))  # 0.5 < 0.7: saturated
    # policy version: sequential over the action tokens' versions (1..2).
    cmap = colormaps["viridis"]
    p = _parse(render_html(_table(), TOK, color_by="policy_version"))
    assert _background(p.tokens[2][1]) == colors.to_hex(cmap(0.0))
    assert _background(p.tokens[9][1]) == colors.to_hex(cmap(1.0))


def test_dis_marks_and_legend():
    view = render_html(_table(), TOK, color_by="values")
    p = _parse(view)
    marked = {i: c for i, (c, *_ ) in enumerate(p.tokens) if "dis-low" in c or "dis-high" in c}
    assert set(marked) == {3, 8}
    assert "dis-low" in marked[3] and "dis-high" in marked[8]
    assert all("line-through" in p.tokens[i][1] for i in marked)
    assert "DIS: no gradient (low)" in p.tokens[3][3] and "advantages=-1" in p.tokens[3][3]
    assert "DIS masked 1 low / 1 high" in view and "learner version 4" in view
    assert 'class="legend"' in view and "&le; 0.7" in view and "&ge; 6" in view
    wide = render_html(_table(eps_low=0.4, eps_high=10.0), TOK)   # 0.5 still low, 7 kept
    assert "DIS masked 1 low / 0 high" in wide


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown color_by"):
        render_html(_table(), TOK, color_by="nope")
    with pytest.raises(ValueError, match="colormap"):
        render_html(_table(), TOK, cmap="not-a-colormap")
