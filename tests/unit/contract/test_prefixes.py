"""The prompt prefix digests both sides compute alike: what a worker's slot holds and what a
new job's prompt starts with (contract/prefixes.py)."""

from __future__ import annotations

from contract.jobspec import JobSpec, Message, Tool
from contract.prefixes import MAX_DIGESTS, cache_scope, is_public, prefixes, public_digest

MODEL = "m"
SYSTEM = Message("system", "You are a helpful assistant. " * 40)


def chat(*messages: Message, **kw) -> JobSpec:
    return JobSpec(id="chatcmpl-x", kind="chat", model=MODEL, messages=messages, **kw)


def test_the_next_turn_starts_with_the_prefix_the_answer_left():
    first = chat(SYSTEM, Message("user", "Tell me about lighthouses."))
    held = prefixes(first, answer="They guide ships.")
    follow = chat(*first.messages, Message("assistant", "They guide ships."), Message("user", "And storms?"))
    asked = prefixes(follow)
    assert asked[len(held) - 1] == held[-1]  # the whole earlier conversation, answer included
    other = prefixes(chat(SYSTEM, Message("user", "Something else.")))
    assert other[0] == held[0] and other[1] != held[1]  # a shared system prompt, nothing more
    assert prefixes(chat(SYSTEM))[0] != prefixes(chat(SYSTEM, tools=(Tool("f"),)))[0]  # rendered too
    long = chat(*(Message("user", f"m{i}") for i in range(100)))
    assert (
        len(prefixes(long)) == MAX_DIGESTS and prefixes(long)[0] == prefixes(chat(Message("user", "m0")))[0]
    )


def test_a_legacy_prompt_is_cut_in_blocks():
    text = JobSpec(id="cmpl-x", kind="text", model=MODEL, prompt="x" * 1000)
    assert [chars for _, chars in prefixes(text)] == [256, 512, 768]


def test_each_cache_scope_has_digests_of_its_own():
    alice, bob = cache_scope("a" * 32), cache_scope("b" * 32)
    salted = cache_scope("a" * 32, "s3cret"), cache_scope("b" * 32, "s3cret")
    assert len({alice, bob, salted[0]}) == 3 and salted[0] == salted[1]  # shared by whoever sends it
    assert "s3cret" not in salted[0] and cache_scope("") == ""  # no keys: one cache for all
    for kind, parts in (("chat", {"messages": (SYSTEM,)}), ("text", {"prompt": "x" * 600})):
        specs = {
            s: JobSpec(id="j", kind=kind, model=MODEL, cache_scope=s, **parts)
            for s in (alice, bob, salted[0], "")
        }
        digests = {scope: {d for d, _ in prefixes(spec)} for scope, spec in specs.items()}
        assert all(digests.values())
        assert all(not (digests[x] & digests[y]) for x in digests for y in digests if x != y)


def test_a_public_prompt_s_digest_is_every_scope_s_and_what_follows_it_each_scope_s_own():
    alice, bob = cache_scope("a" * 32), cache_scope("b" * 32)
    question = Message("user", "What is the capital of France?")
    public = frozenset({public_digest(SYSTEM.content)})

    def digests(scope: str) -> list[str]:
        spec = chat(SYSTEM, question, cache_scope=scope)
        return [
            d
            for d, _ in prefixes(
                chat(SYSTEM, question, cache_scope=scope, public_prompt=is_public(spec, public))
            )
        ]

    a, b = digests(alice), digests(bob)
    assert a[0] == b[0] and a[1] != b[1]  # the system prompt is shared, the question is not
    private = [d for d, _ in prefixes(chat(SYSTEM, question, cache_scope=alice))]
    assert private[0] != a[0] and private[1] != a[1]  # without the operator's word, nothing is shared
    assert not is_public(chat(Message("user", SYSTEM.content)), public)  # a system prompt only
    assert not is_public(chat(Message("system", SYSTEM.content + " ")), public)  # exactly


def test_a_public_prompt_s_digest_is_of_its_text_alone_and_the_tools_are_the_scope_s():
    alice, bob = cache_scope("a" * 32), cache_scope("b" * 32)
    question = Message("user", "What is the capital of France?")
    secret = (Tool("crm_export_all_customers", "Every customer's record.", {"type": "object"}),)
    guess = (Tool("crm_delete_customer", "One customer's record.", {"type": "object"}),)

    def digests(scope: str, **kw) -> list[str]:
        spec = chat(SYSTEM, question, cache_scope=scope, public_prompt=True, **kw)
        return [d for d, _ in prefixes(spec)]

    plain = digests(alice)
    variants = [
        digests(bob),
        digests(alice, tools=secret),
        digests(bob, tools=guess),
        digests(alice, template_kwargs={"enable_thinking": False}),
    ]
    assert all(v[0] == plain[0] for v in variants)  # the public text's digest: every job's
    # what follows it depends on the scope, the tools and the template's kwargs
    assert len({plain[1], *(v[1] for v in variants)}) == len(variants) + 1
    assert digests(alice, tools=secret)[1] == digests(alice, tools=secret)[1]  # and on nothing else
    private = [d for d, _ in prefixes(chat(SYSTEM, question, cache_scope=alice, tools=secret))]
    assert private[0] != plain[0]  # not public: the tools and scope are in every digest


def test_an_image_is_its_hash_in_the_digest_of_its_message_and_all_after_it():
    from contract.media.images import MARKER
    from contract.prefixes import IMAGE_CHARS

    def asked(image: str) -> JobSpec:
        return chat(SYSTEM, Message("user", f"What is in {MARKER}?"), images=(image,))

    a, b = prefixes(asked("a" * 64)), prefixes(asked("b" * 64))
    assert a[0] == b[0] and a[1] != b[1]  # the system prompt is shared, the turn is not
    assert prefixes(asked("a" * 64)) == a
    assert a[1][1] - a[0][1] == len(f"What is in {MARKER}?") + IMAGE_CHARS  # a match worth routing
    held = prefixes(asked("a" * 64), answer="A lighthouse.")
    follow = chat(
        *asked("a" * 64).messages,
        Message("assistant", "A lighthouse."),
        Message("user", "And its colour?"),
        images=("a" * 64,),
    )
    assert prefixes(follow)[len(held) - 1] == held[-1]  # the next turn still finds the answer
    low = chat(*asked("a" * 64).messages, images=("a" * 64,), low_detail=(0,))
    assert prefixes(low)[1] != a[1]  # read at low detail: other embeddings, another prefix
