"""SFT demonstrations (sao.data.demonstrations): correct answers, tool fraction, masks on action tokens only."""
import numpy as np
import pytest

from sao.data import demonstrations
from sao.models.tokenizer import ByteTokenizer


def test_demonstrations_are_correct_and_mixed():
    import reasoning_gym as rg
    demos = demonstrations.arithmetic_demonstrations(400, seed=3, tool_fraction=0.3)
    frac = np.mean([d.uses_tool for d in demos])
    assert 0.2 < frac < 0.4
    ds = rg.create_dataset("basic_arithmetic", size=400, seed=3, **demonstrations.QUICKSTART_TASK_KWARGS)
    for demo, entry in zip(demos, ds):
        assert ds.score_answer(answer=demo.answer, entry=entry) == 1.0
        assert demo.prompt == entry["question"] + "\n"
    tool = next(d for d in demos if d.uses_tool)
    assert tool.response_text.startswith("<python>print(") and "<output>" in tool.response_text
    direct = next(d for d in demos if not d.uses_tool)
    assert direct.response_text == f"<answer>{direct.answer}</answer>"


def test_chain_sum_and_bad_args():
    demos = demonstrations.arithmetic_demonstrations(20, seed=1, tool_fraction=1.0, task="chain_sum")
    assert all(d.uses_tool for d in demos)
    with pytest.raises(ValueError, match="tool_fraction"):
        demonstrations.arithmetic_demonstrations(5, seed=0, tool_fraction=1.5)
    with pytest.raises(ValueError, match="evaluates"):
        demonstrations.make_demonstration("Calculate 1 + 1.", "1 + 1", "3", use_tool=True)
    with pytest.raises(ValueError, match="unsupported"):
        demonstrations.make_demonstration("x", "__import__('os')", "0", use_tool=True)


def test_tokenized_masks_cover_actions_only():
    tok = ByteTokenizer()
    demo = demonstrations.make_demonstration("Calculate 2 * 3.", "2 * 3", "6", use_tool=True)
    arr = demonstrations.tokenize_demonstrations([demo], tok, max_len=64, add_bos=True)
    n = int(arr.lengths[0])
    ids = arr.tokens[0, :n].tolist()
    assert ids[0] == tok.bos_id and (arr.tokens[0, n:] == tok.pad_id).all()
    acted = tok.decode([t for t, m in zip(ids, arr.loss_mask[0]) if m])
    assert acted == "<python>print(2 * 3)</python><answer>6</answer>"
    observed = tok.decode(ids[1:])
    assert observed == "Calculate 2 * 3.\n<python>print(2 * 3)</python><output>6</output><answer>6</answer>"
    with pytest.raises(ValueError, match="max_len"):
        demonstrations.tokenize_demonstrations([demo], tok, max_len=10)


def test_style_mix_demonstrates_every_drift_style():
    import re

    from sao.envs.judges import STYLES
    mix = demonstrations.parse_style_mix("bare:0.7,sentence:0.15,boxed:0.15")
    mixed = demonstrations.arithmetic_demonstrations(600, seed=3, tool_fraction=0.5,
                                                     style_mix=mix)
    plain = demonstrations.arithmetic_demonstrations(600, seed=3, tool_fraction=0.5)
    assert [d.uses_tool for d in mixed] == [d.uses_tool for d in plain]   # same tool choices
    counts = dict.fromkeys(STYLES, 0)
    for d in mixed:
        final = re.search(r"<answer>(.*)</answer>$", d.response_text).group(1)
        matched = [s for s, (_, rx) in STYLES.items() if rx.fullmatch(final)]
        assert len(matched) == 1 and d.answer in final       # the drift judge's style regexes
        counts[matched[0]] += 1
    assert 0.63 < counts["bare"] / 600 < 0.77
    assert 0.1 < counts["sentence"] / 600 < 0.2 and 0.1 < counts["boxed"] / 600 < 0.2
    assert all(d.response_text.endswith(f"<answer>{d.answer}</answer>") for d in plain)
    assert demonstrations.parse_style_mix("") == {}
    for bad in ("bold:1", "bare:-1", "bare:0"):
        with pytest.raises(ValueError):
            demonstrations.parse_style_mix(bad)
