"""worker/attempts/sender.py: an attempt's pieces read by its reply and published with their ids and
logprobs, a continuation's reply fed the earlier text first, and the thinking's tokens counted over
the whole job (bytes, not characters; harmony's several analysis messages)."""

from __future__ import annotations

from contract.entries import Delta, TokenLogprob
from worker.attempts.attempt import Attempt
from worker.attempts.sender import Sender
from worker.engine.steps.picks import Pick
from worker.text.harmony import Harmony
from worker.text.replies import PlainReply
from worker.text.textstream import Piece
from worker.text.thinking import Thinking

WORDS = {1: b"Hmm", 2: b", so", 3: b"</think>", 4: b"\n\n", 5: b"Yes", 6: b"\xc3", 7: b"\xa9"}


def piece(token: int) -> bytes:
    return WORDS.get(token, f"<{token}>".encode())


class Recorder:
    """Stands in for the publisher: the deltas it was handed, as the stream would hold them."""

    def __init__(self) -> None:
        self.deltas: list[Delta] = []

    def delta(self, attempt, text, token_ids, calls=(), logprobs=(), reasoning=""):
        entry = Delta(
            epoch=attempt.epoch,
            text=text,
            token_ids=token_ids,
            calls=calls,
            logprobs=logprobs,
            reasoning=reasoning,
        )
        self.deltas.append(entry)


class Listening(PlainReply):
    """A plain reply that remembers what it was fed."""

    def __init__(self) -> None:
        self.fed: list[str] = []

    def feed(self, text):
        self.fed.append(text)
        return super().feed(text)


def sender(reply, prior=(), logprobs=False, pieces=piece) -> tuple[Sender, Recorder]:
    pub = Recorder()
    return Sender(pieces, pub, Attempt("chatcmpl-s", 2), reply, logprobs, list(prior)), pub  # type: ignore[arg-type]


def feed(out: Sender, tokens: list[int], pieces=piece) -> None:
    """As the attempt's loop does, each token released at once (no stop strings, whole characters)."""
    for t in tokens:
        out.picked(Pick(t), pieces(t))
        out.send(Piece(pieces(t).decode(), (t,)))


def test_a_piece_is_published_as_the_reply_splits_it_with_its_token_ids():
    out, pub = sender(Thinking(PlainReply(), opened=True))
    out.send(Piece("Hmm</think>\n\nYes", (1, 3, 4, 5)))
    out.send(None)  # the assembler held everything back: nothing to publish
    assert pub.deltas == [Delta(epoch=2, text="Yes", token_ids=(1, 3, 4, 5), reasoning="Hmm")]
    assert out.said() == "Hmm</think>\n\nYes"


def test_logprobs_travel_with_the_piece_that_released_their_tokens():
    out, pub = sender(PlainReply(), logprobs=True)
    out.picked(Pick(6, -0.5, ((6, -0.5), (5, -1.25))), b"\xc3")  # half a character: held back
    out.picked(Pick(7, -0.125), b"\xa9")
    out.picked(Pick(5, -2.0), b"Yes")
    out.send(Piece("é", (6, 7)))
    out.send(Piece("Yes", (5,)))
    first = (TokenLogprob(b"\xc3", -0.5, ((b"\xc3", -0.5), (b"Yes", -1.25))), TokenLogprob(b"\xa9", -0.125))
    assert [d.logprobs for d in pub.deltas] == [first, (TokenLogprob(b"Yes", -2.0),)]


def test_without_logprobs_asked_or_given_none_are_published():
    out, pub = sender(PlainReply(), logprobs=False)
    out.picked(Pick(5, -2.0, ((5, -2.0),)), b"Yes")
    out.send(Piece("Yes", (5,)))
    unsampled, pub2 = sender(PlainReply(), logprobs=True)
    unsampled.picked(Pick(5), b"Yes")  # a pick with no logprob (a forced token)
    unsampled.send(Piece("Yes", (5,)))
    assert pub.deltas[0].logprobs == () and pub2.deltas[0].logprobs == ()


def test_a_continuation_reads_the_earlier_text_whole_and_publishes_none_of_it():
    reply = Listening()
    out, pub = sender(reply, prior=[1, 6, 7])  # "é" split between two earlier tokens
    assert reply.fed == ["Hmmé"] and pub.deltas == [] and out.said() == ""
    feed(out, [5])
    assert reply.fed == ["Hmmé", "Yes"] and out.said() == "Yes"


def test_a_continuation_goes_on_where_the_earlier_attempts_left_the_thinking():
    out, pub = sender(Thinking(PlainReply(), opened=True), prior=[1, 3])  # they closed the block
    feed(out, [4, 5])
    assert [(d.reasoning, d.text) for d in pub.deltas] == [("", ""), ("", "Yes")]
    assert out.reasoning_tokens() == 3  # "Hmm", "</think>", "\n\n": theirs counted with its own


def test_the_thinking_counts_the_tokens_that_began_before_the_answer():
    out, _ = sender(Thinking(PlainReply(), opened=True))
    feed(out, [1, 2])
    assert out.open_thinking() == 2 and out.reasoning_tokens() == 2  # open: all of them
    feed(out, [3, 4, 5, 2])
    assert out.reasoning_tokens() == 4 and out.open_thinking() is None  # closed: no budget counts


def test_a_reply_without_thinking_counts_none():
    out, _ = sender(PlainReply())
    feed(out, [1, 2, 5])
    assert out.reasoning_tokens() == 0 and out.open_thinking() is None
    unopened, _ = sender(Thinking(PlainReply(), opened=False))
    feed(unopened, [5, 2])  # the model wrote no block
    assert unopened.reasoning_tokens() == 0 and unopened.open_thinking() is None


def test_thinking_in_multibyte_text_is_counted_in_bytes_not_characters():
    """Four 2-byte characters, then a close split in two tokens: the second starts at byte 13,
    character 9, inside the thinking either way; the answer starts at character 12, byte 16."""
    words = {1: "éééé".encode(), 2: b"</thi", 3: b"nk>", 4: b"A"}
    out, _ = sender(Thinking(PlainReply(), opened=True), pieces=words.__getitem__)
    feed(out, [1, 2, 3, 4], pieces=words.__getitem__)
    assert out.reasoning_tokens() == 3


def test_harmony_counts_each_analysis_message_and_not_what_lies_between():
    words = {
        1: b"<|channel|>analysis<|message|>",
        2: b"one",
        3: b"<|end|>",
        4: b"<|start|>assistant<|channel|>analysis<|message|>",
        5: b"two",
        6: b"<|end|>",
        7: b"<|start|>assistant<|channel|>final<|message|>",
        8: b"Hi",
    }
    reply = Harmony(PlainReply(), "chatcmpl-s")
    out, pub = sender(reply, pieces=words.__getitem__)
    feed(out, [1, 2], pieces=words.__getitem__)
    assert out.open_thinking() == 2
    feed(out, [3, 4, 5, 6, 7, 8], pieces=words.__getitem__)
    assert out.reasoning_tokens() == 4 and out.open_thinking() is None
    assert "".join(d.reasoning for d in pub.deltas) == "onetwo"
    assert "".join(d.text for d in pub.deltas) == "Hi"


def test_the_end_publishes_what_the_reply_still_held_with_no_tokens():
    out, pub = sender(Thinking(PlainReply(), opened=True))
    feed(out, [1])
    out.send(Piece("</thi", (9,)))  # a close begun, never finished
    out.end()
    assert pub.deltas[-1] == Delta(epoch=2, text="", token_ids=(), reasoning="</thi")
    quiet, pub2 = sender(PlainReply())
    feed(quiet, [5])
    quiet.end()  # a plain reply holds nothing: no empty delta
    assert len(pub2.deltas) == 1
