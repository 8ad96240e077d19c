"""grain prompt pipelines: determinism, per-epoch reshuffle, sharding, resume, splits;
the dispatcher's prompt stream (epoch / group fields) and what carries them to the learner."""
import json
import threading

import numpy as np
import pytest

from sao.data.prompts import PromptStream, prompt_dataset, prompt_iterator, split_records
from sao.envs.base import make_prompt
from sao.fleet.leases import LeaseBook
from sao.rpc import codec
from sao.types import Trajectory


def records(n=20, task="t"):
    return [make_prompt(f"{task}/{i}", task, f"question {i}", {"answer": str(i)})
            for i in range(n)]


def take(it, n):
    return [next(it) for _ in range(n)]


def test_deterministic_and_reshuffled_each_epoch():
    recs = records()
    a = take(prompt_iterator(recs, seed=7), 60)
    b = take(prompt_iterator(recs, seed=7), 60)
    assert a == b
    epochs = [[r["prompt_id"] for r in a[i * 20:(i + 1) * 20]] for i in range(3)]
    assert all(sorted(e) == sorted(r["prompt_id"] for r in recs) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]                      # new order every epoch
    assert [r["epoch"] for r in a] == [i // 20 for i in range(60)]
    c = take(prompt_iterator(recs, seed=8), 20)
    assert [r["prompt_id"] for r in c] != epochs[0]                  # the seed matters
    plain = take(prompt_iterator(recs, seed=7, shuffle=False), 20)
    assert [r["prompt_id"] for r in plain] == [r["prompt_id"] for r in recs]


def test_shards_are_disjoint_and_cover_everything():
    recs = records(23)
    seen = []
    for k in range(4):
        shard = list(prompt_dataset(recs, seed=1, shard_index=k, shard_count=4, num_epochs=1))
        seen.append({r["prompt_id"] for r in shard})
    assert sum(len(s) for s in seen) == 23
    assert set().union(*seen) == {r["prompt_id"] for r in recs}
    with pytest.raises(ValueError):
        prompt_dataset(recs, seed=1, shard_index=4, shard_count=4)
    with pytest.raises(ValueError):
        prompt_dataset(records(2), seed=1, shard_index=2, shard_count=3)     # empty shard


def test_finite_epochs_end():
    assert len(list(prompt_iterator(records(5), seed=0, num_epochs=2))) == 10


@pytest.mark.parametrize("consumed", [7, 33])
def test_checkpoint_round_trip_resumes_exactly(consumed):
    recs = records()
    it = prompt_iterator(recs, seed=3, shard_index=1, shard_count=2)
    take(it, consumed)
    state = json.loads(json.dumps(it.get_state()))           # survives a JSON checkpoint
    expected = take(it, 25)
    resumed = prompt_iterator(recs, seed=3, shard_index=1, shard_count=2, state=state)
    assert take(resumed, 25) == expected
    fresh = prompt_iterator(recs, seed=3, shard_index=1, shard_count=2)
    fresh.set_state(state)
    assert take(fresh, 25) == expected


def test_train_and_heldout_split_disjoint_and_seeded():
    recs = records(200)
    recs += [make_prompt("dup/0", "t", "question 3", {"answer": "3"})]   # repeated question
    train, held = split_records(recs, heldout_fraction=0.2, seed=0)
    train_texts, held_texts = {r["text"] for r in train}, {r["text"] for r in held}
    assert not train_texts & held_texts
    assert len(train) + len(held) == len(recs)
    assert 20 <= len(held) <= 60
    assert split_records(list(reversed(recs)), heldout_fraction=0.2, seed=0)[1] == \
        list(reversed(held))                                       # order independent
    other = split_records(recs, heldout_fraction=0.2, seed=1)[1]
    assert {r["prompt_id"] for r in other} != {r["prompt_id"] for r in held}
    assert split_records(recs, heldout_fraction=0.0, seed=0)[1] == []
    with pytest.raises(ValueError):
        split_records(recs, heldout_fraction=1.5, seed=0)


def test_bad_records_raise():
    with pytest.raises(ValueError):
        prompt_dataset([{"text": "no id"}], seed=0)
    with pytest.raises(ValueError):
        prompt_dataset(records(3) + records(3), seed=0)             # duplicate ids


def test_prompt_stream_issues_each_record_group_size_times_with_fields():
    recs = records(3)
    stream = PromptStream(prompt_iterator(recs, seed=1, shuffle=False), group_size=2)
    out = take(stream, 8)
    assert [(r["prompt_id"], r["epoch"], r["group"]) for r in out] == [
        ("t/0", 0, 0), ("t/0", 0, 1), ("t/1", 0, 0), ("t/1", 0, 1),
        ("t/2", 0, 0), ("t/2", 0, 1), ("t/0", 1, 0), ("t/0", 1, 1)]
    assert out[0]["text"] == "question 0"                          # the record itself, ids untouched
    single = take(PromptStream(prompt_iterator(recs, seed=1, shuffle=False)), 4)
    assert [(r["prompt_id"], r["epoch"], r["group"]) for r in single] == [
        ("t/0", 0, 0), ("t/1", 0, 0), ("t/2", 0, 0), ("t/0", 1, 0)]
    with pytest.raises(ValueError, match="group_size"):
        PromptStream(iter(recs), group_size=0)


def test_prompt_stream_is_thread_safe_and_resumes_at_record_boundaries():
    recs = records(50)
    stream = PromptStream(prompt_iterator(recs, seed=3), group_size=2)
    got, lock = [], threading.Lock()

    def pull():
        for _ in range(25):
            r = next(stream)
            with lock:
                got.append((r["prompt_id"], r["epoch"], r["group"]))
    threads = [threading.Thread(target=pull) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 100 and {g for _, _, g in got} == {0, 1}   # no issue twice, none lost
    state = json.loads(json.dumps(stream.get_state()))
    again = PromptStream(prompt_iterator(recs, seed=3), group_size=2)
    again.set_state(state)
    assert next(again)["prompt_id"] == next(stream)["prompt_id"]


def test_prompt_stream_resumes_inside_a_group():
    """Copies of a record not yet handed out are in the state: a restored stream
    hands out the rest of the group, then the next record (none lost, none twice)."""
    recs = records(10)
    stream = PromptStream(prompt_iterator(recs, seed=1), group_size=3)
    taken = [next(stream) for _ in range(4)]                # one whole group, one copy of the next
    state = json.loads(json.dumps(stream.get_state()))
    assert [c["group"] for c in state["copies"]] == [1, 2]
    again = PromptStream(prompt_iterator(recs, seed=1), group_size=3)
    again.set_state(state)
    rest = [next(again) for _ in range(5)]
    assert rest == [next(stream) for _ in range(5)]
    issues = [(r["prompt_id"], r["epoch"], r["group"]) for r in taken + rest]
    assert len(set(issues)) == 9 and [g for _, _, g in issues] == [0, 1, 2] * 3
    # A bare iterator position (checkpoints that kept no copies) restores the position alone.
    old = PromptStream(prompt_iterator(recs, seed=1), group_size=3)
    old.set_state(state["iterator"])
    first = next(old)
    assert (first["prompt_id"], first["group"]) == (rest[2]["prompt_id"], 0)
    with pytest.raises(ValueError, match="at most 3"):
        old.set_state({**state, "copies": [{}] * 4})


def test_epoch_and_group_reach_the_trajectory_without_parsing_ids():
    """The lease book names each (prompt, epoch, group) issue apart and hands the fields back."""
    recs = records(2)
    book = LeaseBook(PromptStream(prompt_iterator(recs, seed=0, shuffle=False), group_size=2))
    leases = [book.issue("w") for _ in range(6)]                   # 2 prompts x 2 groups, then epoch 1
    keys = [lease.prompt_id for lease in leases]
    assert len(set(keys)) == 6
    assert [book.identity(k) for k in keys] == [
        ("t/0", 0, 0), ("t/0", 0, 1), ("t/1", 0, 0), ("t/1", 0, 1), ("t/0", 1, 0), ("t/0", 1, 1)]
    state = json.loads(json.dumps(book.state_dict()))              # outstanding -> re-issued on resume
    restored = LeaseBook([])
    restored.load_state_dict(state)
    assert [restored.identity(restored.issue("w").prompt_id) for _ in range(6)] == [
        book.identity(k) for k in keys]
    assert LeaseBook([{"prompt_id": "plain"}]).issue("w").prompt_id == "plain"
    # On the wire and in checkpoints (the codec) the fields survive.
    t = Trajectory(tokens=np.arange(3), action_mask=[False, True, True], rollout_logprobs=[0, -1, -1],
                   policy_version=[0, 0, 0], reward=1.0, finish="stop", prompt_id="t/0",
                   trajectory_id="x", epoch=3, group=5)
    back = codec.decode(codec.encode(t))
    assert (back.prompt_id, back.epoch, back.group) == ("t/0", 3, 5)


def test_prompt_stream_resample_issues_a_fresh_group_and_survives_a_checkpoint():
    # A dropped GRPO group's prompt comes back as attempt 1 (groups G..2G-1), ahead of new records.
    recs = [make_prompt(f"p{i}", "t", f"q{i}", {}) for i in range(4)]
    stream = PromptStream(prompt_iterator(recs, seed=0), group_size=2, records=recs)
    first = next(stream)
    assert stream.resample("p3", 0, 1) and not stream.resample("nope", 0, 1)
    second = next(stream)                                   # the rest of the current group first
    assert (second["prompt_id"], second["group"]) == (first["prompt_id"], 1)
    state = json.loads(json.dumps(stream.get_state()))
    assert state["resample"] == [["p3", 0, 1]]
    again = PromptStream(prompt_iterator(recs, seed=0), group_size=2, records=recs)
    again.set_state(state)
    out = [next(again) for _ in range(3)]
    assert [(r["prompt_id"], r["epoch"], r["group"]) for r in out[:2]] == [("p3", 0, 2), ("p3", 0, 3)]
    assert out[2]["prompt_id"] != "p3" or out[2]["group"] == 0  # then the iterator goes on
    with pytest.raises(ValueError, match="attempt"):
        stream.resample("p1", 0, 0)
    with pytest.raises(ValueError, match="does not have"):
        PromptStream(prompt_iterator(recs, seed=0), group_size=2).set_state(state)
