"""An attempt's text on its way to the stream. The job's reply (worker/text/replies.py) reads
each piece the text assembler releases. It reads thinking, content and tool-call fragments.
Each piece is then published with its tokens' ids and logprobs.

A continuation's sender first reads the text earlier attempts generated. So the reply goes on
where they were. What it says of that text was sent by them. It counts their tokens with its
own. So the thinking's share of the completion is counted over the whole job.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.entries import TokenLogprob
from worker.attempts.attempt import Attempt
from worker.attempts.publisher import Publisher
from worker.engine.steps.picks import Pick
from worker.text.replies import Reply
from worker.text.textstream import Piece


class Sender:
    def __init__(
        self,
        piece: Callable[[int], bytes],
        pub: Publisher,
        attempt: Attempt,
        reply: Reply,
        logprobs: bool,
        prior: list[int],
    ) -> None:
        self._piece, self._pub, self._attempt, self._reply = piece, pub, attempt, reply
        self._logprobs = logprobs
        # for the tokens the assembler holds back
        self._held: list[TokenLogprob] = []
        # bytes of each token generated, all attempts'
        self._sizes = [len(piece(t)) for t in prior]
        # the text the reply read, all attempts'
        self._read: list[str] = []
        # this attempt's
        self._said: list[str] = []
        if prior:
            text = b"".join(piece(t) for t in prior).decode("utf-8", "replace")
            reply.feed(text)
            self._read.append(text)

    def picked(self, pick: Pick, piece: bytes) -> None:
        self._sizes.append(len(piece))
        if self._logprobs and pick.logprob is not None:
            top = tuple((self._piece(t), lp) for t, lp in pick.top)
            self._held.append(TokenLogprob(piece, pick.logprob, top))

    def send(self, piece: Piece | None) -> None:
        if piece is None:
            return
        parts = self._reply.feed(piece.text)
        n = len(piece.token_ids)
        logprobs, self._held = tuple(self._held[:n]), self._held[n:]
        self._pub.delta(
            self._attempt, parts.content, piece.token_ids, tuple(parts.calls), logprobs, parts.reasoning
        )
        self._read.append(piece.text)
        self._said.append(piece.text)

    def end(self) -> None:
        """What the reply still held. That is text that might have opened a tool call, or
        closed a thinking block."""
        parts = self._reply.end()
        if parts:
            self._pub.delta(self._attempt, parts.content, (), tuple(parts.calls), reasoning=parts.reasoning)

    def reasoning_tokens(self) -> int:
        """The completion's tokens that began in its thinking, over every attempt. A block's
        tags and the whitespace before the answer count. So do harmony's analysis messages,
        headers included."""
        spans = getattr(self._reply, "reasoning_spans", [])
        if not spans:
            return 0
        if spans == [(0, None)]:
            return len(self._sizes)
        text = "".join(self._read)
        bounds = [(len(text[:s].encode()), None if e is None else len(text[:e].encode())) for s, e in spans]
        count = at = 0
        for size in self._sizes:
            count += any(s <= at and (e is None or at < e) for s, e in bounds)
            at += size
        return count

    def open_thinking(self) -> int | None:
        """The thinking's tokens so far (every attempt's) while it is open now, else None. A
        thinking budget counts these."""
        return self.reasoning_tokens() if getattr(self._reply, "in_thinking", False) else None

    def said(self) -> str:
        return "".join(self._said)
