import inspect
import json
import re
from pathlib import Path

import pytest

from contract import entries, keys, tiers
from contract.entries import CallPart, Delta, Failed, Finished, Started, join_calls
from contract.jobspec import InvalidSpec, JobSpec, Message


def _slot_tag(key: str) -> str:
    return key[key.index("{") + 1 : key.index("}")]


def test_a_job_and_its_shards_indexes_share_one_cluster_hash_tag():
    from redis.crc import key_slot

    job_id = "chatcmpl-abc_DEF-1"
    shard = keys.shard(job_id)
    tagged = [
        keys.job(job_id),
        keys.events(job_id),
        keys.alive(job_id),
        keys.running(shard),
        keys.pending(shard),
    ]
    assert {_slot_tag(k) for k in tagged} == {keys.TAGS[shard]}
    assert len({key_slot(k.encode()) for k in tagged}) == 1
    assert len(set(tagged)) == len(tagged)


def test_shards_spread_evenly_over_the_cluster_slots():
    from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

    share = REDIS_CLUSTER_HASH_SLOTS // keys.SHARDS
    assert [key_slot(t.encode()) // share for t in keys.TAGS] == list(range(keys.SHARDS))
    ids = [f"chatcmpl-{n:05d}" for n in range(3200)]
    per_shard = [sum(1 for i in ids if keys.shard(i) == s) for s in range(keys.SHARDS)]
    assert min(per_shard) > 50 and max(per_shard) < 150  # 100 each on average


def _every_tokenspool_key() -> list[str]:
    """Every key contract.keys names, with `<param>` for each of its parameters."""
    out = []
    for name, obj in vars(keys).items():
        if isinstance(obj, str) and obj.startswith(keys.PREFIX + ":"):
            out.append(obj)
        elif (
            inspect.isfunction(obj)
            and obj.__module__ == keys.__name__
            and not name.startswith("_")
            and inspect.signature(obj).return_annotation == "str"  # names a key (not `shard`)
        ):
            params = [
                p.name
                for p in inspect.signature(obj).parameters.values()
                if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty
            ]
            if name == "owned":
                out += [keys.owned("<owner>", index) for index in keys.OwnerIndex]
            elif name == "batch":
                out += [keys.batch("<batch_id>", part) for part in keys.BatchPart]
            elif "epoch" not in params and not _keyword_only(obj):
                key = obj(*(0 if p == "shard" else f"<{p}>" for p in params))
                if isinstance(key, str) and key.startswith(keys.PREFIX + ":"):
                    out.append(re.sub(r"\{[^}]*\}", "{<shard>}", key))  # a shard's hash tag
    return out


def _keyword_only(f) -> bool:
    return any(p.kind == p.KEYWORD_ONLY for p in inspect.signature(f).parameters.values())


def test_the_protocol_doc_names_every_key():
    table = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
    keyed = _every_tokenspool_key()
    assert len(keyed) > 30
    assert [k for k in keyed if f"`{k}`" not in table] == []


def test_queue_is_named_after_the_model():
    assert tiers.queue_name("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    "entry",
    [
        Started(epoch=1, worker="w-1", prompt_tokens=12),
        Started(epoch=1, worker="w-1", prompt_tokens=12, cleared_tool_uses=4, cleared_input_tokens=350),
        Delta(epoch=2, text="héllo\n", token_ids=(1, 2, 3)),
        Delta(epoch=1, text="", token_ids=()),
        Delta(epoch=1, text="Yes.", token_ids=(4, 5), reasoning="2 < 3, so"),
        Finished(epoch=3, finish_reason="length", prompt_tokens=10, completion_tokens=20),
        Finished(epoch=3, finish_reason="stop", prompt_tokens=9, completion_tokens=20, reasoning_tokens=17),
        Finished(epoch=3, finish_reason="stop", prompt_tokens=400, completion_tokens=2, cached_tokens=399),
        Finished(epoch=2, finish_reason="stop", prompt_tokens=5, completion_tokens=3, stop_sequence="\nQ:"),
        Finished(
            epoch=1,
            finish_reason="stop",
            prompt_tokens=7,
            completion_tokens=0,
            vectors=b"\x00\x01" * 8,
            dimensions=2,
        ),
        Failed(
            epoch=1,
            message="too long",
            type="invalid_request_error",
            code="context_length_exceeded",
            param="messages",
        ),
        Failed(epoch=1, message="lost", type="server_error", code="worker_lost"),
    ],
)
def test_entries_round_trip_through_redis_field_encoding(entry):
    fields = entries.encode(entry)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}  # what redis-py returns
    assert entries.decode(as_bytes) == entry
    assert entries.decode(fields) == entry


def test_terminal_entries():
    assert entries.is_terminal(Finished(epoch=1, finish_reason="stop", prompt_tokens=1, completion_tokens=1))
    assert entries.is_terminal(Failed(epoch=1, message="m", type="t", code="c"))
    assert not entries.is_terminal(Delta(epoch=1, text="x", token_ids=(1,)))


def test_finish_reason_must_be_stop_or_length():
    with pytest.raises(ValueError):
        entries.encode(Finished(epoch=1, finish_reason="", prompt_tokens=1, completion_tokens=1))


def test_unknown_entry_kind_is_rejected():
    with pytest.raises(ValueError):
        entries.decode({"k": "?", "e": "1"})


def _spec(**kw):
    base = dict(id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "hi"),))
    base.update(kw)
    return JobSpec(**base)


def test_jobspec_round_trips_as_json_data():
    spec = _spec(stop=("a", "b"), seed=3, max_tokens=5, temperature=0.0, cache_scope="key:ab12")
    import json

    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    # unset, it is left out: a worker of an earlier release (which refuses unknown fields) takes the job
    assert "cache_scope" not in _spec().to_dict()


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "image"},
        {"messages": ()},
        {"max_tokens": -1},
        {"thinking_budget": -1},
        {"thinking_budget": 1.5},
        {"max_tokens": True},
        {"temperature": 3.0},
        {"temperature": float("nan")},
        {"top_p": -0.1},
        {"seed": "1"},
        {"stop": ("",)},
        {"cache_scope": 7},
        {"messages": (Message("tool", "x"),)},
    ],
)
def test_jobspec_rejects_what_the_api_would_refuse(bad):
    data = _spec().to_dict()
    data.update(_spec(**bad).to_dict() if "messages" in bad else bad)
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(data)


def test_a_thinking_budget_travels_only_when_set():
    assert "thinking_budget" not in _spec().to_dict()  # a worker of an earlier release takes the job
    assert JobSpec.from_dict(_spec(thinking_budget=1024).to_dict()).thinking_budget == 1024


def test_a_jobspec_of_no_tokens_counts_its_prompt():
    """max_tokens 0: the worker tokenizes the prompt and ends (the Messages API's count_tokens)."""
    spec = _spec(max_tokens=0)
    assert JobSpec.from_dict(spec.to_dict()).max_tokens == 0


def test_an_embed_job_round_trips_and_travels_its_fields_only_when_set():
    spec = JobSpec(id="embd-x", kind="embed", model="m#embed", inputs=("a b", (1, 2, 3)), dimensions=64)
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert "inputs" not in _spec().to_dict() and "dimensions" not in _spec().to_dict()


@pytest.mark.parametrize(
    "bad",
    [
        {"inputs": []},  # no inputs
        {"inputs": "abc"},  # not a list
        {"inputs": [[]]},  # an empty token array
        {"inputs": [[1, -2]]},
        {"inputs": [[1, True]]},
        {"inputs": [3]},
        {"inputs": ["a"], "dimensions": -1},
        {"inputs": ["a"], "prompt": "also a prompt"},
    ],
)
def test_an_embed_job_is_refused_unless_its_inputs_are_strings_or_token_ids(bad):
    data = {"id": "embd-x", "kind": "embed", "model": "m#embed", **bad}
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(data)


def test_a_completion_carries_no_inputs():
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(_spec().to_dict() | {"inputs": ["a"]})


def test_jobspec_rejects_unknown_fields_and_non_objects():
    data = _spec().to_dict() | {"func": "os.system"}
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(data)
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(["os.system", "rm -rf /"])
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict({"id": "x"})


def test_call_fragments_join_into_whole_calls():
    calls: list[CallPart] = []
    join_calls(calls, [CallPart(0, '{"a"', "call_1", "f"), CallPart(0, ": 1}")])
    join_calls(calls, [CallPart(1, "", "call_2", "g"), CallPart(1, "{}"), CallPart(2, "{")])
    assert calls == [
        CallPart(0, '{"a": 1}', "call_1", "f"),
        CallPart(1, "{}", "call_2", "g"),
        CallPart(2, "{"),  # another index without an id: a call of its own, never glued on
    ]


def test_an_assistants_thinking_travels_only_when_set_and_only_on_an_assistant():
    spec = _spec(messages=(Message("user", "hi"), Message("assistant", "Yes.", reasoning="2 < 3")))
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert "reasoning" not in _spec().to_dict()["messages"][0]
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(_spec(messages=(Message("user", "hi", reasoning="x"),)).to_dict())


def test_a_started_entry_of_an_earlier_worker_cleared_nothing():
    entry = entries.decode({"k": "s", "e": "1", "w": "w-1", "p": "12"})
    assert (entry.cleared_tool_uses, entry.cleared_input_tokens) == (0, 0)
