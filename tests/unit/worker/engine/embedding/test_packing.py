import threading

from worker.engine.embedding.packing import Request, Waiting


def test_a_request_takes_at_most_half_a_decode_while_another_waits():
    waiting = Waiting()
    a = Request([[1] * 5, [2] * 5, [3] * 5])
    b = Request([[4] * 2])
    waiting.add(a)
    waiting.add(b)
    first = waiting.next_decode(max_tokens=12, max_seqs=8)
    # a's second input is over half the tokens: b's goes in first, then a's in the room left
    assert [(i.request, i.index) for i in first] == [(a, 0), (b, 0), (a, 1)]
    assert [(i.request, i.index) for i in waiting.next_decode(12, 8)] == [(a, 2)]
    assert not len(waiting)


def test_inputs_go_oldest_request_first_so_requests_end_one_after_another():
    waiting = Waiting()
    requests = [Request([[i] * 2] * 4) for i in range(4)]
    for r in requests:
        waiting.add(r)
    first = waiting.next_decode(max_tokens=100, max_seqs=8)
    assert [i.request for i in first] == [requests[0]] * 4 + [requests[1]] * 4  # two whole requests


def test_a_small_request_is_not_kept_behind_a_large_one_that_came_first():
    waiting = Waiting()
    large = Request([[1] * 3] * 100)
    small = Request([[2] * 3, [3] * 3])
    waiting.add(large)
    waiting.add(small)
    first = waiting.next_decode(max_tokens=30, max_seqs=64)
    assert [i.request for i in first].count(small) == 2  # both its inputs in the first decode


def test_a_request_given_up_leaves_nothing_waiting():
    waiting = Waiting()
    gone = Request([[1]] * 4)
    kept = Request([[2]])
    waiting.add(gone)
    waiting.add(kept)
    waiting.next_decode(max_tokens=1, max_seqs=1)  # one of gone's inputs is in a decode
    waiting.abandon(gone)
    assert gone.abandoned and [i.request for i in waiting.next_decode(10, 10)] == [kept]


def test_the_sequences_of_a_decode_are_bounded_too():
    waiting = Waiting()
    waiting.add(Request([[1]] * 10))
    assert len(waiting.next_decode(max_tokens=100, max_seqs=4)) == 4
    assert len(waiting.next_decode(max_tokens=100, max_seqs=100)) == 6


def test_one_input_as_long_as_the_batch_goes_alone():
    waiting = Waiting()
    waiting.add(Request([[1] * 8, [2]]))
    assert [len(i.tokens) for i in waiting.next_decode(max_tokens=8, max_seqs=4)] == [8]


def test_waiting_for_inputs_times_out_empty_and_wakes_on_a_new_request():
    waiting = Waiting()
    assert waiting.next_decode(8, 4, timeout=0.01) == []
    got = []
    t = threading.Thread(target=lambda: got.append(waiting.next_decode(8, 4, timeout=10)))
    t.start()
    waiting.add(Request([[7]]))
    t.join(5)
    assert [i.tokens for i in got[0]] == [[7]]


def test_a_request_is_done_once_every_input_has_its_vector():
    import numpy as np

    r = Request([[1], [2]])
    r.fill(1, np.ones(2))
    assert not r.done.is_set()
    r.fill(0, np.zeros(2))
    assert r.done.is_set() and [v.tolist() for v in r.vectors] == [[0, 0], [1, 1]]


def test_batch_lines_fill_only_the_room_interactive_requests_leave():
    waiting = Waiting()
    line = Request([[1] * 4, [2] * 4], batch=True)
    waiting.add(line)  # first in, but a Batch API line's
    asked = Request([[3] * 6])
    waiting.add(asked)
    first = waiting.next_decode(max_tokens=10, max_seqs=8)
    assert [(i.request, i.index) for i in first] == [
        (asked, 0),
        (line, 0),
    ]  # 6 + 4: the second line input waits
    assert [(i.request, i.index) for i in waiting.next_decode(10, 8)] == [(line, 1)]


def test_a_batch_line_alone_goes_in_whatever_its_length():
    waiting = Waiting()
    waiting.add(Request([[1] * 10], batch=True))
    assert len(waiting.next_decode(max_tokens=10, max_seqs=1)) == 1


def test_another_keys_one_input_goes_into_the_next_decode_beside_a_keys_two_floods():
    """Shares are per key (the job's owner), not per request: a key's two requests of
    thousands of inputs fill no decode before another key's one input is in it."""
    waiting = Waiting()
    a1 = Request([[1] * 4] * 2000, owner="a")
    a2 = Request([[2] * 4] * 2000, owner="a")
    b = Request([[3] * 4], owner="b")
    for r in (a1, a2, b):
        waiting.add(r)
    first = waiting.next_decode(max_tokens=64, max_seqs=16)
    assert b in [i.request for i in first] and len(first) == 16  # and the decode is full
    assert b.taken == 1 and not any(r is b for r in waiting._interactive)


def test_keys_take_turns_one_input_each_and_a_key_s_requests_keep_their_order():
    waiting = Waiting()
    a1 = Request([[1]] * 3, owner="a")
    a2 = Request([[2]] * 3, owner="a")
    b = Request([[3]] * 3, owner="b")
    for r in (a1, a2, b):
        waiting.add(r)
    got = [(i.request, i.index) for i in waiting.next_decode(max_tokens=100, max_seqs=4)]
    # a's first, b's first, a's next (its own order: oldest request first, half a decode each)
    assert got == [(a1, 0), (b, 0), (a1, 1), (b, 1)]


def test_a_key_whose_next_input_does_not_fit_leaves_the_room_to_the_others():
    waiting = Waiting()
    a = Request([[1] * 6, [1] * 6], owner="a")
    b = Request([[2]] * 4, owner="b")
    waiting.add(a)
    waiting.add(b)
    got = [(i.request, i.index) for i in waiting.next_decode(max_tokens=10, max_seqs=8)]
    assert got == [(a, 0), (b, 0), (b, 1), (b, 2), (b, 3)]  # a's second (6 tokens) would not fit


def test_a_newcomer_key_s_decode_holds_its_input_and_as_many_tokens_of_the_flood():
    """Issue 74: B's one input behind A's flood waited for the decode under way and then for
    a full decode of A's inputs beside its own. A key with nothing in the last decode goes
    first in the next, and the flood fills it only up to the newcomer's tokens: B waits for
    the decode under way and about its own input's."""
    waiting = Waiting()
    flood = Request([[1] * 4] * 200, owner="a")
    waiting.add(flood)
    assert len(waiting.next_decode(max_tokens=64, max_seqs=16)) == 16  # a alone: full decodes
    b = Request([[3] * 8], owner="b")
    waiting.add(b)
    got = waiting.next_decode(max_tokens=64, max_seqs=16)
    assert [(i.request, len(i.tokens)) for i in got] == [(b, 8), (flood, 4), (flood, 4)]
    assert len(waiting.next_decode(max_tokens=64, max_seqs=16)) == 16  # then full ones again


def test_a_newcomer_decode_leaves_batch_lines_no_more_room_than_the_flood():
    waiting = Waiting()
    flood = Request([[1] * 4] * 200, owner="a")
    line = Request([[2] * 4] * 50, batch=True, owner="c")
    waiting.add(flood)
    waiting.add(line)
    waiting.next_decode(max_tokens=64, max_seqs=16)
    waiting.add(b := Request([[3] * 4], owner="b"))
    got = [i.request for i in waiting.next_decode(max_tokens=64, max_seqs=16)]
    assert got == [b, flood]  # 8 tokens: b's 4 and as many of the others'


def test_a_key_left_out_of_a_decode_is_a_newcomer_in_the_next_so_none_starves():
    """Keys that each had nothing in the last decode cannot keep a flood out: it was not in
    the decode they took, so it is a newcomer beside them in the next."""
    waiting = Waiting()
    flood = Request([[1] * 6] * 100, owner="a")
    waiting.add(flood)
    waiting.next_decode(max_tokens=12, max_seqs=8)
    waiting.add(Request([[2] * 4], owner="b"))
    assert [i.request.owner for i in waiting.next_decode(12, 8)] == ["b"]  # a's 6 do not fit in 8
    waiting.add(Request([[3] * 4], owner="c"))
    assert "a" in [i.request.owner for i in waiting.next_decode(12, 8)]  # a was out: it is new too
