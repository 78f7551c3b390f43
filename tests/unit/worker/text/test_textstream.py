from worker.text.textstream import TextAssembler


def feed(assembler, tokens):
    out = []
    for i, piece in enumerate(tokens):
        p = assembler.push(i, piece)
        if p is not None:
            out.append(p)
        if assembler.stopped:
            break
    return out


def test_plain_tokens_are_released_one_by_one_with_their_ids():
    out = feed(TextAssembler(), [b"Hel", b"lo", b" world"])
    assert [(p.text, p.token_ids) for p in out] == [("Hel", (0,)), ("lo", (1,)), (" world", (2,))]


def test_a_character_split_across_tokens_is_held_until_whole():
    ba = "バ".encode()  # e3 83 90
    out = feed(TextAssembler(), [b"x", ba[:2], ba[2:], b"y"])
    assert [(p.text, p.token_ids) for p in out] == [("x", (0,)), ("バ", (1, 2)), ("y", (3,))]
    assert all("\ufffd" not in p.text for p in out)


def test_four_byte_character_split_in_three():
    emoji = "🙂".encode()
    out = feed(TextAssembler(), [emoji[:1], emoji[1:3], emoji[3:]])
    assert [(p.text, p.token_ids) for p in out] == [("🙂", (0, 1, 2))]


def test_flush_drops_a_character_cut_off_by_the_end_of_generation():
    # max_tokens can stop generation between the two halves of a character: the client
    # must not receive U+FFFD for a character the model never finished.
    a = TextAssembler()
    assert a.push(0, b"ok") is not None
    assert a.push(1, "é".encode()[:1]) is None
    tail = a.flush()
    assert tail is not None and tail.text == "" and tail.token_ids == (1,)


def test_flush_keeps_complete_text_before_a_cut_off_character():
    a = TextAssembler(stop=["xyz"])
    assert a.push(0, b"x") is None  # held: could start the stop string
    assert a.push(1, "é".encode()[:1]) is None
    tail = a.flush()
    assert tail is not None and tail.text == "x" and tail.token_ids == (0, 1)


def test_invalid_bytes_do_not_block_the_stream():
    out = feed(TextAssembler(), [b"\xff", b"ok"])
    assert "".join(p.text for p in out) == "\ufffdok"


def test_stop_string_in_one_token_cuts_text_before_it():
    a = TextAssembler(stop=["END"])
    out = feed(a, [b"abc", b"xENDy"])
    assert a.stopped
    assert "".join(p.text for p in out) == "abcx"


def test_stop_string_split_across_tokens_is_never_published():
    a = TextAssembler(stop=["\n\n"])
    out = feed(a, [b"one", b"\n", b"\n", b"two"])
    assert a.stopped
    assert "".join(p.text for p in out) == "one"


def test_held_prefix_is_released_when_it_does_not_become_a_stop():
    a = TextAssembler(stop=["STOP"])
    out = feed(a, [b"ST", b"OR", b"Y"])
    assert not a.stopped
    assert [(p.text, p.token_ids) for p in out] == [("STOR", (0, 1)), ("Y", (2,))]


def test_flush_releases_a_held_stop_prefix_at_the_end():
    a = TextAssembler(stop=["STOP"])
    assert feed(a, [b"ST"]) == []
    tail = a.flush()
    assert tail is not None and tail.text == "ST"


def test_earliest_of_several_stop_strings_wins():
    a = TextAssembler(stop=["b", "a"])
    out = feed(a, [b"xab"])
    assert "".join(p.text for p in out) == "x"
    assert a.matched == "a"  # what Anthropic's stop_sequence reports


def test_no_stop_string_matched_until_one_is_found():
    a = TextAssembler(stop=["END"])
    feed(a, [b"EN"])
    assert a.matched == ""
    feed(a, [b"D"])
    assert a.matched == "END"
