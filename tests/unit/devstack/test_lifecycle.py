"""devstack/lifecycle.py: docs/glossary.md and docs/protocol.md's lifecycle section are
generated from contract/lifecycle/, and the README and the package map link the glossary."""

from __future__ import annotations

from contract.lifecycle import attempt, glossary, states
from devstack.lifecycle import BEGIN, END, ROOT, glossary_md, key_pattern, lifecycle_md, spliced

STALE = "is stale: run python -m devstack.lifecycle"


def test_the_glossary_doc_is_generated_from_the_declarations():
    assert (ROOT / "docs" / "glossary.md").read_text() == glossary_md(), f"docs/glossary.md {STALE}"


def test_the_protocol_doc_s_lifecycle_section_is_generated_from_the_declarations():
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    assert protocol.count(BEGIN) == protocol.count(END) == 1
    assert protocol == spliced(protocol), f"docs/protocol.md's lifecycle section {STALE}"


def test_the_section_names_every_state_move_and_script_and_the_glossary_every_word():
    section = lifecycle_md()
    for state in states.JOB_STATES + attempt.ATTEMPT_STATES:
        assert f"| `{state.name}` | " in section
    for move in states.JOB_MOVES + attempt.ATTEMPT_MOVES:
        assert f"| {move.name} | " in section and all(f"`{s}`" in section for s in move.scripts)
    assert all(f"| **{w.word}** | {w.meaning} |" in glossary_md() for w in glossary.WORDS)


def test_splicing_replaces_only_the_section():
    old = f"# Doc\n\nbefore\n{BEGIN}\nwhat was\n{END}\n\nafter\n"
    new = spliced(old)
    assert new.startswith("# Doc\n\nbefore\n") and new.endswith("\n\nafter\n") and "what was" not in new


def test_keys_are_shown_as_redis_names_them():
    assert key_pattern("running") == "ts:{<shard>}:running"
    assert key_pattern("job") == "ts:{<shard>}:job:<job_id>"
    assert key_pattern("owned.ROUTED") == "ts:owner:<owner>:routed"
    assert key_pattern("STATS") == "ts:stats"


def test_the_readme_and_the_package_map_link_the_glossary():
    assert "(docs/glossary.md)" in (ROOT / "README.md").read_text()
    assert "(glossary.md)" in (ROOT / "docs" / "architecture.md").read_text()
