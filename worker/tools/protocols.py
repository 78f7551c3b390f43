"""How a model is told about tools and how it writes its calls. There is one protocol per kind
of chat template. It is chosen once per model from what its template does.

- `HermesTools` (hermes.py): the Hermes protocol. The template renders `tools` itself and
  teaches `<tool_call>{"name": ..., "arguments": ...}</tool_call>`. Hermes, Qwen 2.5 and 3,
  SmolLM3's upstream template and many fine-tunes teach it. The conversation goes to the
  template as it is. Tool calls and tool results are included.
- `HarmonyTools` (harmony.py): gpt-oss's templates. Their channels carry thinking, answer and
  calls (worker/text/harmony.py reads them).
- `JsonTools` (json_envelope.py): any other template. SmolLM2's, for one, renders roles and
  contents only. This is llama.cpp's "Generic" format. A system message describes the
  tools and the answer's JSON envelope. Earlier calls become the assistant's envelopes. Tool
  results become user messages holding `{"tool_response": ...}`.

Each protocol's module holds both halves. It gives the messages and template arguments to
render. It gives the grammar a job's sampler enforces, built from call_rules.py. Its `Reply`
reads the answer (`HermesReply`, `JsonReply`). With `tool_choice` required or naming a tool,
the grammar admits only calls (of that tool). So the call is well formed whatever the model.
With "auto", the JSON envelope's grammar admits a call or a `{"response": ...}`. Hermes text
is free until a call. That call is then constrained from its `<tool_call>` on, and parsed.
The constraint admits offered tools, their schemas, and one call unless parallel
(worker/engine/grammar.py's TriggeredGate). A `response_format` shapes the response in both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from contract.jobspec import JobSpec
from worker.text import harmony
from worker.text.replies import Reply
from worker.tools.harmony import HarmonyTools
from worker.tools.hermes import OPEN, HermesTools
from worker.tools.json_envelope import JsonTools

PROBE_TOOL = "tokenspool_probe_tool"


class ToolProtocol(Protocol):
    name: str

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        """(messages for the template, each with a `content` string; more template arguments)."""
        ...

    def grammar(self, spec: JobSpec) -> str | None: ...

    def trigger(self, spec: JobSpec) -> str | None:
        """The text from whose first occurrence on `grammar` applies (None: from the start)."""
        ...

    def reply(self, spec: JobSpec) -> Reply: ...


def detect(render: Callable[..., str], template: str) -> ToolProtocol:
    """Harmony if the template speaks gpt-oss's channels. Hermes if it renders a tool it is
    given and speaks `<tool_call>`. Else JSON."""
    if harmony.CHANNEL in template and harmony.CALL in template:
        return HarmonyTools()
    if OPEN not in template:
        return JsonTools()
    tool = {
        "type": "function",
        "function": {"name": PROBE_TOOL, "description": "", "parameters": {"type": "object"}},
    }
    try:
        text = render(messages=[{"role": "user", "content": "x"}], tools=[tool])
    # a template that cannot take tools: the JSON envelope works with any
    except Exception:
        return JsonTools()
    return HermesTools() if PROBE_TOOL in text else JsonTools()
