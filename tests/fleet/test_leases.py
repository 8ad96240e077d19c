"""LeaseBook: exactly-once bookkeeping without any network."""
import json

import pytest

from sao.fleet.leases import LeaseBook


def test_issue_settle_finish_and_duplicates():
    book = LeaseBook([{"text": "a"}, {"prompt_id": "b"}, {"id": 7}])
    l0, l1, l2 = (book.issue("w") for _ in range(3))
    assert [l.prompt_id for l in (l0, l1, l2)] == ["prompt-0", "b", "7"]
    assert book.issue("w") is None and book.in_flight == 3 and book.held_by("w") == 3
    again = book.issue_again(l0, "v")
    assert book.attempts["prompt-0"] == 2 and book.in_flight == 3
    assert book.settle(again.lease_id) == ("prompt-0", again)
    assert [l.lease_id for l in book.finish("prompt-0")] == [l0.lease_id]  # withdrawn
    assert book.settle(l0.lease_id) == ("prompt-0", None)   # a late copy: known, not outstanding
    assert book.settle("never-issued") == (None, None)
    assert "prompt-0" in book.done and not book.exhausted


def test_drop_link_requeues_unanswered_prompts_first():
    book = LeaseBook([{"prompt_id": f"p{i}"} for i in range(4)])
    a0, a1 = book.issue("a"), book.issue("a")
    b2 = book.issue("b")
    book.issue_again(a1, "b")                 # p1 also runs on b
    book.settle(a0.lease_id)
    book.finish("p0")
    assert book.drop_link("a") == 0           # p0 answered, p1 still running on b
    assert book.drop_link("b") == 2           # p2, p1 go back (issue order), ahead of p3
    assert [book.issue("c").prompt_id for _ in range(3)] == ["p2", "p1", "p3"]
    assert b2.prompt_id == "p2"


def test_state_roundtrip_keeps_assigned_ids_and_order():
    src = iter([{"text": "x"}, {"text": "y"}, {"text": "z"}])
    book = LeaseBook(src)
    first, second = book.issue("w"), book.issue("w")
    book.settle(first.lease_id)
    book.finish(first.prompt_id)
    state = json.loads(json.dumps(book.state_dict()))
    restored = LeaseBook(src)                 # the caller's iterator continues
    restored.load_state_dict(state)
    assert [restored.issue("w").prompt_id for _ in range(2)] == [second.prompt_id, "prompt-2"]
    assert restored.done == {"prompt-0"} and restored.issue("w") is None


def test_non_dict_prompt_is_refused():
    with pytest.raises(TypeError, match="dicts"):
        LeaseBook(["text"]).issue("w")
