"""worker.text.replies: content and tool-call fragments from generated text, however it is cut."""

from tests.unit.worker.reading import CID
from worker.text.replies import CallPart, Parts, PlainReply, call_id


def test_plain_reply_is_content():
    assert PlainReply().feed("abc") == Parts(content="abc")


def test_call_ids_are_stable_and_openai_shaped():
    assert call_id(CID, 0) == call_id(CID, 0) != call_id(CID, 1) != call_id("other", 1)
    assert call_id(CID, 0).startswith("call_") and len(call_id(CID, 0)) == 29


def test_parts_merge_fragments_of_one_call():
    p = Parts().add(Parts(calls=[CallPart(0, "", "call_1", "f")])).add(Parts(calls=[CallPart(0, "{}")]))
    assert p.calls == [CallPart(0, "{}", "call_1", "f")]
