"""A `TokenTable` as HTML: each token's text on a background coloured by one quantity.

`render_html` returns a `TokenHtml` (a ``str`` with ``_repr_html_``), so it
shows inline in Jupyter and can be written to a file. Inline styles only (no
``<style>`` block, no script), so the output renders the same wherever HTML is
shown.

* Action tokens get a background from a matplotlib colormap (`QUANTITIES`):
  diverging and centred on 0 for ``advantages``, ``values`` and ``returns``;
  ``ratio`` is coloured on a log scale centred on 1 that saturates at the DIS
  band edges ``1 - eps_low`` / ``1 + eps_high``; sequential for
  ``policy_version`` and ``staleness``. Prompt and observation tokens have no
  colour (the learner computes nothing for them).
* Observation spans (what the environment inserted: tool output and its
  frame) are boxed with a dashed border; prompt text is grey.
* Tokens DIS gives no gradient are struck through and outlined: blue when the
  ratio is at or below the band (``dis-low``), red at or above it (``dis-high``).
* Every token's ``title`` (hover) lists its position, id and quantities; a
  legend gives the colour scale and the markers.

matplotlib is the ``notebooks`` / ``test`` extra and is imported when rendering.
"""
from __future__ import annotations

import html
import math
import unicodedata

import numpy as np

from sao.analysis.token_table import TokenTable, token_texts

# quantity -> (default colormap, scale): "signed" centred on 0, "ratio" log scale
# centred on 1 with the DIS band edges as its ends, "sequential" from min to max.
QUANTITIES = {
    "advantages": ("RdBu", "signed"),
    "values": ("PiYG", "signed"),
    "returns": ("PiYG", "signed"),
    "ratio": ("PuOr_r", "ratio"),
    "policy_version": ("viridis", "sequential"),
    "staleness": ("magma_r", "sequential"),
}
DIS_COLORS = {"dis-low": "#1f4fd1", "dis-high": "#d11f1f"}
_TITLE_COLUMNS = ("values", "advantages", "returns", "ratio", "dis_weight", "policy_version",
                  "staleness", "rollout_logprobs", "logprobs")


class TokenHtml(str):
    """An HTML fragment that Jupyter displays as HTML."""

    def _repr_html_(self) -> str:
        return str(self)


def _norm(table: TokenTable, color_by: str, scale: str, vmax: float | None):
    """A matplotlib ``Normalize`` for ``color_by`` over the action tokens, and
    the values it is applied to (log ratio for ``ratio``)."""
    from matplotlib import colors
    cols = table.columns
    x = cols[color_by].astype(np.float64)
    on = cols["action_mask"] & np.isfinite(x)
    if scale == "ratio":
        x = np.log(np.where(on, x, 1.0))
        low = math.log(max(1.0 - table.eps_low, 1e-9))      # eps_low = 1: no lower edge
        return colors.TwoSlopeNorm(vcenter=0.0, vmin=low, vmax=math.log(1.0 + table.eps_high)), x, on
    if scale == "signed":
        half = vmax if vmax is not None else float(np.max(np.abs(x[on]), initial=0.0))
        return colors.CenteredNorm(vcenter=0.0, halfrange=half or 1.0), x, on
    lo = float(np.min(x[on])) if on.any() else 0.0
    hi = vmax if vmax is not None else (float(np.max(x[on])) if on.any() else lo)
    return colors.Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1.0), x, on


def _hex(rgba) -> str:
    from matplotlib import colors
    return colors.to_hex(rgba, keep_alpha=False)


def _ink(rgba) -> str:
    """Black or white text, whichever reads better on ``rgba``."""
    r, g, b = rgba[:3]
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#fff"


def _visible(ch: str) -> str:
    if ch == "\n":
        return "↵\n"
    if ch == "\t":
        return "→\t"
    if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
        return repr(ch)[1:-1]                              # e.g. \x00, \r, \u200b
    return ch


def _shown(text: str) -> str:
    """Token text made visible: newlines as ↵ (then the break), tabs as →, other
    control and invisible characters as escapes, empty text as ∅; HTML-escaped."""
    if text == "":
        return "∅"
    return html.escape("".join(_visible(ch) for ch in text))


def _title(table: TokenTable, t: int, text: str) -> str:
    cols = table.columns
    parts = [f"t={t}", f"id={int(cols['tokens'][t])}", f"text={text!r}", cols["span"][t]]
    if cols["action_mask"][t]:
        for name in _TITLE_COLUMNS:
            v = cols[name][t]
            parts.append(f"{name}={v:.4g}" if isinstance(v, (float, np.floating)) else f"{name}={v}")
        if cols["dis_masked_low"][t] or cols["dis_masked_high"][t]:
            parts.append("DIS: no gradient (" + ("low" if cols["dis_masked_low"][t] else "high")
                         + ")")
    return html.escape(" | ".join(parts), quote=True)


def _legend(cmap, norm, color_by: str, scale: str, table: TokenTable) -> str:
    stops = ", ".join(_hex(cmap(f)) for f in np.linspace(0.0, 1.0, 11))
    lo, hi = norm.vmin, norm.vmax
    mid = 0.0 if scale != "sequential" else (lo + hi) / 2
    fmt = (lambda v: f"{math.exp(v):.3g}") if scale == "ratio" else (lambda v: f"{v:.3g}")
    name = "ratio (log scale, ends = DIS band)" if scale == "ratio" else color_by
    bar = (f'<span style="display:inline-block;width:220px;height:12px;vertical-align:middle;'
           f'background:linear-gradient(to right, {stops});border:1px solid #999"></span>')
    low, high = DIS_COLORS["dis-low"], DIS_COLORS["dis-high"]
    return (f'<div class="legend" style="margin-top:6px;font-size:90%">'
            f'<b>{html.escape(name)}</b> {fmt(lo)} {bar} {fmt(hi)} (centre {fmt(mid)}); '
            f'<span style="color:#888">prompt</span>; '
            f'<span style="border:1px dashed #444;padding:0 2px">observation</span>; '
            f'<span style="text-decoration:line-through;outline:2px solid {low}">DIS: ratio '
            f'&le; {1 - table.eps_low:.3g}, no gradient</span>; '
            f'<span style="text-decoration:line-through;outline:2px solid {high}">DIS: ratio '
            f'&ge; {1 + table.eps_high:.3g}, no gradient</span></div>')


def _header(table: TokenTable, color_by: str) -> str:
    tr, cols = table.trajectory, table.columns
    return (f'<div class="header" style="font-weight:bold;margin-bottom:4px">'
            f'{html.escape(tr.trajectory_id)} &middot; reward {tr.reward:g} &middot; '
            f'finish {html.escape(tr.finish)} &middot; {tr.length} tokens, '
            f'{int(cols["action_mask"].sum())} action, {table.num_observation_tokens} observation '
            f'&middot; DIS masked {int(cols["dis_masked_low"].sum())} low / '
            f'{int(cols["dis_masked_high"].sum())} high &middot; learner version '
            f'{table.learner_version} &middot; coloured by {html.escape(color_by)}</div>')


def render_html(table: TokenTable, tokenizer, *, color_by: str = "advantages",
                cmap: str | None = None, vmax: float | None = None) -> TokenHtml:
    """One trajectory's tokens coloured by ``color_by`` (module doc).

    Args:
      table: a `TokenTable` (`sao.analysis.token_tables`).
      tokenizer: decodes each token id (`token_texts`).
      color_by: a key of `QUANTITIES`.
      cmap: a matplotlib colormap name instead of the quantity's default.
      vmax: colour scale end (``|x|`` for signed quantities, the top for
        sequential ones) instead of the trajectory's own; ignored for ``ratio``.
        Pass one value to compare several trajectories on one scale.
    Returns:
      a `TokenHtml` with one ``<span class="tok ...">`` per token (classes
      ``prompt`` / ``action`` / ``observation``, plus ``dis-low`` / ``dis-high``),
      observation spans inside ``<span class="observation-span">``, a header
      and a legend.
    Raises:
      ValueError: unknown ``color_by`` or colormap.
    """
    from matplotlib import colormaps
    if color_by not in QUANTITIES:
        raise ValueError(f"unknown color_by {color_by!r}; valid: {tuple(QUANTITIES)}")
    default_cmap, scale = QUANTITIES[color_by]
    try:
        cm = colormaps[cmap or default_cmap]
    except KeyError as e:
        raise ValueError(f"unknown matplotlib colormap {cmap!r}") from e
    norm, x, on = _norm(table, color_by, scale, vmax)
    cols, texts = table.columns, token_texts(table.columns["tokens"], tokenizer)
    out = []
    for kind, start, stop in table.spans:
        if kind == "observation":
            out.append('<span class="observation-span" title="observation (environment)" '
                       'style="border:1px dashed #444;border-radius:3px;padding:1px 2px">')
        for t in range(start, stop):
            classes, style = ["tok", kind], []
            if kind == "prompt":
                style.append("color:#888")
            if on[t]:
                rgba = cm(float(norm(x[t])))
                style += [f"background:{_hex(rgba)}", f"color:{_ink(rgba)}"]
            for flag in ("dis-low", "dis-high"):
                if cols["dis_masked_" + flag[4:]][t]:
                    classes.append(flag)
                    style += ["text-decoration:line-through",
                              f"outline:2px solid {DIS_COLORS[flag]}"]
            out.append(f'<span class="{" ".join(classes)}" data-t="{t}" '
                       f'title="{_title(table, t, texts[t])}" style="{";".join(style)}">'
                       f'{_shown(texts[t])}</span>')
        if kind == "observation":
            out.append("</span>")
    body = ('<div class="tokens" style="white-space:pre-wrap;font-family:monospace;'
            f'line-height:1.9">{"".join(out)}</div>')
    return TokenHtml(f'<div class="sao-token-view" style="margin:8px 0">'
                     f'{_header(table, color_by)}{body}{_legend(cm, norm, color_by, scale, table)}'
                     f'</div>')
