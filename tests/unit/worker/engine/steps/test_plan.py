"""worker/engine/steps/plan.py: which sequences step, and what one batch step feeds llama.cpp: rows by
slot, up to a chunk of each prompt."""

from __future__ import annotations

from worker.engine.steps.cost import StepCost
from worker.engine.steps.plan import (
    batch_capacity,
    budgeted,
    choose_slot,
    common_prefix,
    compaction,
    plan,
    prefix_source,
    shareable,
    spare_slot,
    stepping,
)
from worker.engine.steps.sequence import Sequence


def seq(slot: int, context: list[int], fed: int = 0, pending: int | None = None) -> Sequence:
    s = Sequence(context=context, sampler=None, room=100)  # type: ignore[arg-type]  # plan never samples
    s.slot, s.fed, s.pending = slot, fed, pending
    return s


def slots(rows) -> list[int]:
    return [s.slot for s, _, _ in rows]


def test_rows_are_ordered_by_slot_whatever_the_admission_order():
    # llama.cpp decodes a non-unified batch in one pass only over increasing, consecutive
    # sequence ids: slots admitted 3, 0, 2, 1 must still be listed 0, 1, 2, 3.
    running = [seq(s, [1, 2], fed=2, pending=10 + s) for s in (3, 0, 2, 1)]
    rows = plan(running, chunk=64)
    assert slots(rows) == [0, 1, 2, 3]
    assert [(t, logits) for _, t, logits in rows] == [(10, True), (11, True), (12, True), (13, True)]
    assert all(s.pending is None for s in running)


def test_a_prefilling_sequence_sits_at_its_slot_with_its_tokens_together():
    a = seq(0, [1], fed=1, pending=7)
    b = seq(2, [1], fed=1, pending=8)
    c = seq(1, [20, 21, 22, 23])  # admitted last, reads its prompt
    rows = plan([a, b, c], chunk=64)
    assert slots(rows) == [0, 1, 1, 1, 1, 2]
    assert [t for _, t, _ in rows] == [7, 20, 21, 22, 23, 8]
    # logits only where a token is sampled: after the pending tokens and the prompt's end
    assert [logits for _, _, logits in rows] == [True, False, False, False, True, True]
    assert c.fed == 4


def test_each_prompt_reads_a_chunk_per_step_so_a_long_one_is_spread_out():
    old = seq(5, list(range(100)))
    young = seq(0, list(range(10)))  # admitted behind the long prompt
    rows = plan([old, young], chunk=64)
    assert slots(rows) == [0] * 10 + [5] * 64  # by slot; the short prompt is not held up
    assert old.fed == 64 and young.fed == 10
    assert [i for i, r in enumerate(rows) if r[2]] == [9]  # logits only where a prompt ends
    young.pending = 99  # it sampled its first token
    rows = plan([old, young], chunk=64)
    assert slots(rows) == [0] + [5] * 36
    assert old.fed == 100 and rows[-1][2]


def test_a_burst_of_prompts_is_read_in_one_step():
    running = [seq(0, [1], fed=1, pending=7)] + [seq(s, list(range(20 + s))) for s in range(1, 8)]
    rows = plan(running, chunk=64)
    assert len(rows) == 1 + sum(20 + s for s in range(1, 8))
    assert all(s.fed == len(s.context) for s in running)
    assert sum(logits for _, _, logits in rows) == 8  # every sequence samples after this step


def test_decoding_sequences_are_not_limited_by_the_chunk():
    running = [seq(s, [1], fed=1, pending=s) for s in range(8)] + [seq(8, list(range(5)))]
    rows = plan(running, chunk=2)
    assert slots(rows) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]


def test_compaction_moves_the_highest_sequence_into_a_gap():
    assert compaction([0, 1, 2, 4, 5, 6, 7], [3]) == [(7, 3)]
    assert compaction([0, 3, 6], [1, 2, 4, 5, 7]) == [(6, 1), (3, 2)]
    assert compaction([2, 3, 4], [0, 1, 5, 6, 7]) == []  # consecutive: one pass already
    assert compaction([5], [0, 1, 2, 3, 4, 6, 7]) == []
    assert compaction([], list(range(8))) == []


TEMPLATE = list(range(1000, 1030))  # the chat template's start: every prompt shares it


def test_a_conversation_s_next_turn_takes_the_slot_its_last_turn_left():
    held = [*TEMPLATE, *range(1, 500)]
    kv = [list(held), [*TEMPLATE, *range(600, 900)], []]
    assert choose_slot([0, 1, 2], kv, [*held, 7, 8, 9], ended=[1, 2, 0]) == 0  # even if not the oldest


def test_a_new_conversation_takes_an_empty_slot_before_evicting_one_for_the_template():
    kv = [[*TEMPLATE, *range(1, 500)], [], [*TEMPLATE, *range(600, 900)], []]
    assert choose_slot([0, 1, 2, 3], kv, [*TEMPLATE, 5, 6], ended=[2, 0, 1, 0]) == 1


def test_with_no_empty_slot_the_least_recently_used_is_evicted():
    kv = [[*TEMPLATE, *range(1, 500)], [*TEMPLATE, *range(600, 900)], [*TEMPLATE, *range(5000, 5100)]]
    assert choose_slot([0, 1, 2], kv, [*TEMPLATE, 5, 6], ended=[3, 1, 2]) == 1


def test_a_long_shared_prefix_beats_recency_and_equal_ones_go_by_recency():
    system = [*TEMPLATE, *range(2000, 4000)]  # a long shared system prompt
    kv = [[*TEMPLATE, *range(1, 100)], [*system, *range(11, 60)], [*system, *range(61, 110)], []]
    assert choose_slot([0, 1, 2, 3], kv, [*system, 31], ended=[1, 3, 2, 0]) == 2  # not 0 nor empty 3
    assert choose_slot([0, 1, 2, 3], kv, [*system, 31], ended=[1, 2, 3, 0]) == 1


def test_a_repeated_prompt_copies_its_prefix_from_the_slot_that_keeps_it():
    prompt = [*TEMPLATE, 5, 6, 7]
    kv = [[*prompt, *range(40, 50)], [], []]  # the prompt's last run and its answer: kept
    slot = choose_slot([0, 1, 2], kv, prompt, ended=[1, 0, 0])
    assert slot == 1  # the kept conversation is not evicted...
    assert prefix_source(slot, kv, prompt) == (0, len(prompt) - 1)  # ...nor the prompt read again


def test_a_prefix_is_copied_from_the_longest_match_running_or_free_and_the_shortest_cache():
    system = [*TEMPLATE, *range(100, 140)]
    kv = [[*system, 1, 2], [*system, *range(500, 700)], [*system, 3, 4], [*TEMPLATE, 9], []]
    assert prefix_source(4, kv, [*system, 8, 9]) == (0, len(system))  # 0 and 2 tie: the lowest
    kv[0] = [*system, *range(500, 600)]
    assert prefix_source(4, kv, [*system, 8, 9]) == (2, len(system))  # the fewest cells to copy
    assert prefix_source(3, kv, [*system, 8, 9]) == (2, len(system))  # more than the slot's own
    assert prefix_source(2, kv, [*system, 8, 9]) is None  # its own holds as much
    assert prefix_source(4, kv, [*system]) == (2, len(system) - 1)  # the last token is read again


def test_another_scope_s_cache_is_neither_extended_nor_copied_and_is_evicted_as_any_other():
    # slot 0 holds another key's run of the very same prompt (contract/prefixes.py cache_scope)
    prompt = [*TEMPLATE, *range(2000, 2400)]
    kv = [[*prompt, *range(40, 50)], [*TEMPLATE, *range(5000, 5100)], []]
    theirs = shareable(kv, ["bob", "alice", ""], prompt, "alice", public=0)
    assert theirs == [0, len(kv[1]), 0]
    assert choose_slot([0, 1, 2], kv, prompt, ended=[2, 1, 0], shares=theirs) == 2  # an empty slot first
    assert prefix_source(2, kv, prompt, shares=theirs) == (1, len(TEMPLATE))  # from slot 1 only
    assert choose_slot([0, 1], kv, prompt, ended=[2, 1, 0], shares=theirs) == 1  # then the least recent
    assert choose_slot([0, 1], kv, prompt, ended=[1, 2, 0], shares=theirs) == 0  # however much it shares
    assert prefix_source(0, kv, prompt, shares=theirs) == (1, len(TEMPLATE))  # taken, none of its own
    assert choose_slot([0, 1, 2], kv, prompt, ended=[2, 1, 0]) == 0  # of one scope: a hit
    assert prefix_source(2, kv, prompt) == (0, len(prompt) - 1)


def test_another_scope_s_cache_of_a_public_prompt_is_shared_up_to_its_end_and_no_further():
    public = [*TEMPLATE, *range(2000, 2300)]  # the system prompt the operator made public
    prompt = [*public, *range(7000, 7050)]  # alice's question after it
    kv = [[*public, *range(7000, 7040)], [*public[:-1], 1], []]  # bob's run of it; a near miss
    shares = shareable(kv, ["bob", "bob", ""], prompt, "alice", public=len(public))
    assert shares == [len(public), 0, 0]  # bob's question, though it starts as alice's, is his
    assert choose_slot([1, 2], kv, prompt, ended=[2, 1, 0], shares=shares) == 2  # slot 0 runs
    assert prefix_source(2, kv, prompt, shares=shares) == (0, len(public))
    assert choose_slot([0, 1, 2], kv, prompt, ended=[2, 1, 0], shares=shares) == 0  # free: the public prompt


def test_no_copy_costs_more_than_the_reading_it_saves():
    long = [*TEMPLATE, *range(100, 100 + 130 * len(TEMPLATE))]  # a long conversation
    assert prefix_source(1, [long, []], [*TEMPLATE, 7, 8]) is None  # for the template alone
    assert prefix_source(1, [long, []], [*long[:200], 7]) == (0, 200)


def test_common_prefix_across_blocks():
    a = list(range(1000))
    assert common_prefix(a, a) == 1000
    assert common_prefix(a, a[:700]) == 700
    assert common_prefix(a, [*a[:513], -1, *a[514:]]) == 513
    assert common_prefix(a, [-1]) == 0 and common_prefix([], a) == 0
    assert common_prefix(a[:256], a) == 256 and common_prefix(a, [*a[:256], -1]) == 256


def test_a_spare_for_a_conversation_in_the_way_is_empty_or_older_and_never_a_move_s_target():
    kv = [[1], [], [2], [3]]
    assert spare_slot([1, 2, 3], kv, ended=[5, 0, 1, 2], avoid={1}, than=5) == 2  # 1 is a move's gap
    assert spare_slot([1, 3], kv, ended=[5, 0, 1, 2], avoid=set(), than=5) == 1  # empty first
    assert spare_slot([3], kv, ended=[5, 0, 1, 7], avoid=set(), than=5) is None  # newer: keep it


def test_batch_lines_sit_out_the_steps_that_read_an_interactive_prompt():
    line = seq(0, [1], fed=1, pending=7)
    line.yields = True
    reading = seq(1, [20, 21, 22])  # an interactive job's prompt
    rows = plan([line, reading], chunk=2)
    assert slots(rows) == [1, 1] and line.pending == 7  # the line's token waits
    rows = plan([line, reading], chunk=2)
    assert slots(rows) == [1] and line.pending == 7  # still reading: the line waits again
    reading.pending = 30  # the prompt is read: everyone decodes together again
    assert slots(plan([line, reading], chunk=2)) == [0, 1] and line.pending is None
    other = seq(2, [40, 41])
    other.yields = True  # a batch line's own prompt holds nobody up
    assert slots(plan([seq(0, [1], fed=1, pending=9), other], chunk=64)) == [0, 2, 2]


def test_batch_lines_read_their_prompts_in_short_steps():
    line = seq(0, list(range(20)))
    line.yields = True
    interactive = seq(1, [1], fed=1, pending=9)  # decoding
    rows = plan([line, interactive], chunk=16, batch_chunk=4)
    assert slots(rows) == [0] * 4 + [1]  # the line reads 4 tokens: the step stays short
    assert line.fed == 4
    reading = seq(2, list(range(100, 120)))  # an interactive prompt reads a whole chunk
    rows = plan([reading], chunk=16, batch_chunk=4)
    assert slots(rows) == [2] * 16


def test_a_budget_reads_the_shortest_prompts_first_and_keeps_the_slot_order():
    decoding = [seq(s, [1], fed=1, pending=s) for s in (0, 2)]
    long = seq(1, list(range(3000)))
    short = seq(3, list(range(5)))  # arrived while the long prompt is read
    rows = plan([*decoding, long, short], chunk=64, budget=8)
    assert slots(rows) == [0, 1, 1, 1, 2, 3, 3, 3, 3, 3]  # 5 for the short one, 3 left for the long
    assert (short.fed, long.fed) == (5, 3)
    for s in decoding:
        s.pending = 1
    rows = plan([*decoding, long], chunk=64, budget=8)
    assert slots(rows) == [0] + [1] * 8 + [2] and long.fed == 11
    rows = plan([long], chunk=64, budget=None)  # nobody decodes: a whole chunk
    assert long.fed == 75


def test_a_batch_lines_prompt_draws_on_the_budget_after_interactive_ones():
    line = seq(0, list(range(20)))
    line.yields = True
    interactive = seq(1, [1], fed=1, pending=9)
    rows = plan([line, interactive], chunk=16, batch_chunk=4, budget=3)
    assert slots(rows) == [0, 0, 0, 1] and line.fed == 3
    reading = seq(2, list(range(100, 110)))  # a short interactive prompt takes the budget
    interactive.pending = 9  # it sampled again
    rows = plan([line, interactive, reading], chunk=16, batch_chunk=4, budget=3)
    assert slots(rows) == [1] + [2] * 10 and line.fed == 3  # the line sits out: a prompt is read


def test_batch_lines_read_a_token_a_step_when_the_budget_is_spent():
    # A line reading its prompt adds a row a step, as a decoding line does: the budget's
    # interactive stream sees the steps of a decoding batch. At none, lines that ended
    # while a stream decoded waited for it to end, and the batch shrank to the lines
    # still decoding (bench/batch_priority.py).
    interactive = seq(0, [1], fed=1, pending=9)
    lines = [seq(s, list(range(20))) for s in (1, 2)]
    for line in lines:
        line.yields = True
    rows = plan([interactive, *lines], chunk=16, batch_chunk=8, budget=0)
    assert slots(rows) == [0, 1, 2] and [line.fed for line in lines] == [1, 1]


def test_a_short_prompt_is_read_whole_beside_a_budget_and_a_long_one_still_moves():
    decoding = seq(0, [1], fed=1, pending=5)
    burst = [seq(s, list(range(40))) for s in (1, 2, 3)]  # stragglers of a burst: one chunk each
    long = seq(4, list(range(3000)))
    rows = plan([decoding, *burst, long], chunk=64, budget=8)
    assert all(s.fed == 40 for s in burst)  # read whole: 120 tokens, over the budget
    assert long.fed == 1  # the budget is spent, but the long prompt moves on
    assert slots(rows) == [0] + [1] * 40 + [2] * 40 + [3] * 40 + [4]


def test_a_suspect_steps_beside_the_streams_that_decode_apart_from_jobs_reading():
    """A death while a suspect proves itself is its own: nothing else that stands still may
    step then (a job still reading its context may be the one that kills as it is read), but
    the streams that decode have gone on and step on, not paused for the proof (a storm's
    proofs once left a worker's streams 20 s without a token). Its context is read whole,
    unbudgeted; once it has gone its tokens on, the others read again."""
    decoding = [seq(s, [1], fed=1, pending=s) for s in (0, 2)]
    suspect = seq(1, list(range(130)))
    suspect.alone_for, suspect.since = 2, 1_000
    reading = seq(4, list(range(50)))
    lines = [seq(3, [1], fed=1, pending=3)]
    lines[0].yields = True
    running = [*decoding, suspect, *lines, reading]
    assert stepping(running, lines_beside=None) == [*decoding, suspect, *lines]
    assert not budgeted(stepping(running, None))
    rows = plan(stepping(running, None), chunk=64)
    # the Batch API line sits out, as beside any prompt read
    assert suspect.fed == 64 and reading.fed == 0 and slots(rows) == [0] + [1] * 64 + [2]
    suspect.fed, suspect.generated, suspect.pending = 130, 1, 7
    for d in decoding:  # sampled at that step
        d.pending = d.slot
    assert stepping(running, lines_beside=None) == [*decoding, suspect, *lines]  # one token on
    suspect.generated = 2
    assert stepping(running, lines_beside=None) == running
    suspect.generated, suspect.closed = 0, True  # a suspect that ended holds nobody up
    assert stepping([s for s in running if not s.closed], None) == [*decoding, *lines, reading]


def test_a_worker_s_suspects_step_as_one_group_unbudgeted():
    """Several suspects (a dead batch's jobs that stood still) prove themselves together, read
    again a whole chunk a step each beside the streams that decode; a suspect that has gone
    its tokens steps on with them."""
    decoding = seq(0, [1], fed=1, pending=0)
    first, second = seq(1, list(range(40))), seq(2, list(range(130)))
    first.alone_for = second.alone_for = 2
    running = [decoding, first, second]
    assert stepping(running, None) == running
    rows = plan(stepping(running, None), chunk=64)
    assert first.fed == 40 and second.fed == 64 and len(rows) == 105
    first.generated, first.pending = 1, 7  # one token on: it decodes while the other reads
    decoding.pending = 5
    assert stepping(running, None) == running and not budgeted(running)
    rows = plan(stepping(running, None), chunk=64)
    assert second.fed == 128 and len(rows) == 66  # a whole chunk, not a budget's share
    first.generated, first.pending, decoding.pending = 2, 8, 6
    second.generated = 2
    assert stepping(running, None) == running and budgeted(running)


def test_step_cost_steers_the_budget_to_the_stretch():
    """A CPU: a step costs 6 ms plus 5 ms a row, and rows of a long prompt more as it grows."""
    cost = StepCost(stretch=2.0, start=64)
    assert cost.budget(8) is None  # the streams' step alone not timed yet: no limit
    cost.add(8, 0.046, decoding=8)  # 8 streams alone: 46 ms
    assert cost.budget(0) is None  # no stream decodes: nothing to keep short
    assert StepCost(stretch=0.0).budget(8) is None  # PREFILL_STRETCH=0: no limit
    for _ in range(40):  # read a long prompt under the budget, the step timed as it goes
        allow = cost.budget(8)
        cost.add(8 + allow, 0.006 + 0.005 * (8 + allow), decoding=8, budgeted=True)
    # twice 46 ms is 92 ms: 17 rows, 9 of them the prompt's
    assert 8 <= cost.budget(8) <= 10
    for _ in range(40):  # later rows cost twice as much (a longer context): fewer of them
        allow = cost.budget(8)
        cost.add(8 + allow, 0.006 + 0.005 * 8 + 0.010 * allow, decoding=8, budgeted=True)
    assert 3 <= cost.budget(8) <= 5
    assert cost.budget(7) == cost.budget(8)  # a count never timed alone: the nearest one's


def test_step_cost_grows_to_whole_chunks_where_rows_are_cheap():
    gpu = StepCost(stretch=2.0, start=64)  # a GPU: 15 ms a pass, 20 us a row
    gpu.add(8, 0.015 + 0.00002 * 8, decoding=8)
    for _ in range(20):
        allow = gpu.budget(8)
        gpu.add(8 + min(allow, 512), 0.015 + 0.00002 * (8 + min(allow, 512)), decoding=8, budgeted=True)
    assert gpu.budget(8) >= 512


def lines_in(slots_: list[int]) -> list[Sequence]:
    out = [seq(s, [1], fed=1, pending=s) for s in slots_]
    for line in out:
        line.yields = True
    return out


def test_lines_beyond_the_share_sit_out_beside_an_interactive_stream():
    lines = lines_in(list(range(16)))  # 16 lines in slots lent while interactive jobs were quiet
    assert stepping(lines, 8) == lines  # alone, every line steps
    stream = seq(16, [1], fed=1, pending=5)
    running = [*lines, stream]
    steps = stepping(running, 8)
    assert [s.slot for s in steps] == list(range(8, 17))  # one pass: the slots next to the stream
    assert slots(plan(steps, chunk=8)) == list(range(8, 17))
    assert all(line.pending is not None for line in lines[:8])  # the others keep their token
    assert stepping(running, None) == running


def test_the_lines_that_step_are_those_nearest_the_interactive_slots():
    lines = lines_in([0, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    stream = seq(5, [1], fed=1, pending=5)  # took the slot a line ended in
    steps = stepping([*lines, stream], 4)
    assert sorted(s.slot for s in steps) == [3, 4, 5, 6, 7]
    assert stepping([*lines[:3], stream], 4) == [*lines[:3], stream]  # within the share: all step


def test_continuations_read_the_longest_stalled_first_in_the_same_rows():
    """A crash storm: a worker taking over a dead batch read a chunk of each continuation a
    step, so none went on before the whole batch was read, and the next death came first
    (a stream 178 s without a token). Their rows are now pooled: the longest stalled is read
    whole first; a new prompt reads as before; the step has as many rows as before."""
    fresh = seq(0, list(range(40)))
    recent, oldest, middle = (seq(s, list(range(150))) for s in (1, 2, 3))
    recent.since, oldest.since, middle.since = 3_000, 1_000, 2_000
    rows = plan([fresh, recent, oldest, middle], chunk=64)
    assert len(rows) == 40 + 3 * 64  # a chunk each, as before
    read = {s.slot: s.fed for s in (fresh, recent, oldest, middle)}
    assert read == {0: 40, 1: 0, 2: 150, 3: 42}
    assert slots(rows) == sorted(slots(rows))  # still in slot order
    rows = plan([fresh, recent, oldest, middle], chunk=64)  # the next step: two left to read
    assert (recent.fed, middle.fed) == (20, 150)


def test_under_a_budget_continuations_share_their_rows_longest_stalled_first():
    decoding = seq(0, [1], fed=1, pending=9)
    a, b = seq(1, list(range(100))), seq(2, list(range(100)))
    a.since, b.since = 2_000, 1_000
    rows = plan([decoding, a, b], chunk=64, budget=2)
    assert len(rows) == 1 + 3  # the budget's 2, then a token for the other (spent): as before
    assert (a.fed, b.fed) == (0, 3)  # all to the one stalled longest


def test_a_prompt_is_read_up_to_its_image_and_on_from_its_end():
    # the image's rows (positions 3-5) are read by a decode of their own, before the step
    image = seq(0, [1, 2, 3, -1, -2, -3, 7, 8])
    image.images = {3: [[0.0], [0.0], [0.0]]}
    rows = plan([image], chunk=64)
    assert [t for _, t, _ in rows] == [1, 2, 3] and image.fed == 3
    assert not any(logits for _, _, logits in rows)  # the prompt's end is not reached
    assert plan([image], chunk=64) == []  # nothing but the image's rows left before its end
    image.fed = 6  # the scheduler read them
    rows = plan([image], chunk=64)
    assert [(t, logits) for _, t, logits in rows] == [(7, False), (8, True)]


def test_a_budget_never_reads_into_an_image():
    stream = seq(1, [5], fed=1, pending=9)
    image = seq(0, [1, -1, -2, 4])
    image.images = {1: [[0.0], [0.0]]}
    rows = plan([stream, image], chunk=2, budget=5)
    assert [(s.slot, t) for s, t, _ in rows] == [(0, 1), (1, 9)]


def test_with_nothing_decoding_prompts_share_the_alone_rows_and_beside_a_stream_read_a_chunk():
    long = seq(0, list(range(2000)))
    rows = plan([long], chunk=64, alone=512)
    assert len(rows) == 512 and long.fed == 512  # llama.cpp's micro-batch, not a chunk
    other = seq(1, list(range(2000)))
    rows = plan([long, other], chunk=64, alone=512)
    assert long.fed == 512 + 256 and other.fed == 256  # shared, each at least a chunk
    many = [seq(s, list(range(100))) for s in range(10)]
    assert len(plan(many, chunk=64, alone=512)) == 640
    assert all(s.fed == 64 for s in many)  # ten prompts: a chunk each, as without `alone`
    stream = seq(2, [1], fed=1, pending=5)
    rows = plan([long, stream], chunk=64, alone=512)
    assert long.fed == 768 + 64  # a stream waits on this step: a chunk, as before


def test_the_batch_holds_the_alone_rows():
    assert batch_capacity(4, 64, 512) == 512 and batch_capacity(8, 128, 512) == 1024
