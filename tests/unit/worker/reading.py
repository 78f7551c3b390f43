"""What the reply tests share: a reply fed generated text in random pieces, and the calls
it said, merged as OpenAI's accumulated message holds them."""

import random

from worker.text.replies import Parts


def run(reply, text: str, seed: int = 0) -> Parts:
    """Feed `text` in random pieces; everything the reply said, merged."""
    rng = random.Random(seed)
    out, i = Parts(), 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.add(reply.feed(text[i : i + n]))
        i += n
    return out.add(reply.end())


def calls(parts: Parts) -> list[dict]:
    """The calls as OpenAI's accumulated message holds them."""
    merged: dict[int, dict] = {}
    for p in parts.calls:
        c = merged.setdefault(p.index, {"id": "", "name": "", "arguments": ""})
        c["id"] += p.id
        c["name"] += p.name
        c["arguments"] += p.arguments
    return [merged[i] for i in sorted(merged)]


CID = "chatcmpl-x"
