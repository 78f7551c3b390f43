"""What the API enqueues for a worker: one completion request, already validated.

The API turns an OpenAI request into a `JobSpec`, with content parts joined and defaults applied. It
enqueues `JobSpec.to_dict()` as the single JSON argument of `keys.JOB_FUNCTION`. The worker rebuilds it
with `JobSpec.from_dict`, which checks every field again. A job planted in Redis by someone else must not
reach the model with arguments the API would refuse.

Structured output and tools travel as what the client asked for, not as a grammar. That is the schemas,
the tool definitions and the tool choice. How a model writes a tool call depends on its chat template
(worker/tools/protocols.py). So the worker builds the grammar itself. Both sides compile the schemas with
the same code (contract/schema.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field

from contract.edits.tool_uses import problem as clear_tool_uses_problem
from contract.freeform.calls import custom_tool_problem
from contract.gbnf import SchemaError
from contract.media import images as media
from contract.schema import schema_grammar
from contract.tiers import PRIORITIES
from contract.tracing import propagation

ROLES = ("system", "user", "assistant", "tool")
KINDS = ("chat", "text", "embed", "rank")
# or NAMED + the name of one tool
TOOL_CHOICES = ("none", "auto", "required")
NAMED = "function:"
FORMATS = ("json_object", "json_schema")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOP_LOGPROBS = 20


class InvalidSpec(ValueError):
    """The job arguments do not describe a valid completion."""


def digest(spec: dict) -> str:
    """A spec's fingerprint. It is the same for the dict the API recorded and the one a worker took from
    RQ. A worker claims a job only for the spec the API recorded for it."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ToolCall:
    """A call an assistant made (in a conversation's history): `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a tool message: the call it answers
    reasoning: str = ""  # an assistant's thinking, sent back: its template renders it or not

    def to_dict(self) -> dict:
        data: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [asdict(c) for c in self.tool_calls]
        if self.tool_call_id:
            data["tool_call_id"] = self.tool_call_id
        if self.reasoning:  # absent unless set: a worker of an earlier release takes the job
            data["reasoning"] = self.reasoning
        return data

    @classmethod
    def from_dict(cls, m: dict) -> Message:
        extra = set(m) - {"role", "content", "tool_calls", "tool_call_id", "reasoning"}
        if extra:
            raise InvalidSpec(f"unknown message fields: {sorted(extra)}")
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in m.get("tool_calls", ()))
        return cls(m["role"], m["content"], calls, m.get("tool_call_id", ""), m.get("reasoning", ""))


@dataclass(frozen=True)
class Tool:
    """A function the model may call: `parameters` is its arguments' JSON schema. A custom tool
    (`freeform`: its format, contract/freeform/) is a function of one string, `input`."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    freeform: dict | None = None  # {"type": "text"} or {"type": "grammar", "syntax", "definition"}


# jinja2.defaults' DEFAULT_NAMESPACE, written out: the API has no jinja2 (the worker's tests compare)
JINJA_GLOBALS = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace"})
# What `template_kwargs` may not name: what the worker gives a template (`self`: the formatter's)
TEMPLATE_RESERVED = (
    frozenset({"messages", "tools", "tool_choice", "functions", "function_call", "add_generation_prompt"})
    | {"bos_token", "eos_token", "raise_exception", "strftime_now", "self"}
    | JINJA_GLOBALS
)
MAX_TEMPLATE_KWARGS = 16
MAX_TEMPLATE_VALUE_CHARS = 256

TEMPERATURE = 1.0  # OpenAI's default, where a request names none
TOP_P = 1.0  # the same


@dataclass(frozen=True)
class JobSpec:
    id: str
    kind: str  # "chat" (messages) or "text" (prompt)
    model: str
    messages: tuple[Message, ...] = ()
    prompt: str = ""
    max_tokens: int | None = None  # None: until the context is full; 0: count the prompt's tokens only
    temperature: float = TEMPERATURE
    top_p: float = TOP_P
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repeat_penalty: float = 1.0  # 1: off; over the last 64 generated tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: dict | None = None  # {"type": "json_object"} or {"type": "json_schema", "schema": ...}
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # TOOL_CHOICES, or NAMED + the name of one of `tools`
    parallel_tool_calls: bool = True
    priority: str = "default"  # the queue tier it waits in (contract.keys.PRIORITIES)
    ignore_eos: bool = False  # llama-server's extension: the end tokens are never sampled
    cache_scope: str = ""  # whose prompt cache it may read and add to (contract/prefixes.py)
    public_prompt: bool = False  # its first message is public (PUBLIC_PROMPTS_FILE): shared cache
    # what the chat template is given beside the messages (chat_template_kwargs, and
    # reasoning_effort: `enable_thinking` false for "none"); scalars only
    template_kwargs: dict = field(default_factory=dict)
    thinking_budget: int = 0  # a reasoning model's thinking ends after this many tokens; 0: no bound
    # an "embed" job's inputs, each a string or token ids (its vectors come back in that order); a
    # "rank" job's, its query then its documents (one score per document comes back)
    inputs: tuple[str | tuple[int, ...], ...] = ()
    dimensions: int = 0  # an embed job's vectors cut to this many and renormalised; 0: whole
    clear_tool_uses: dict | None = None  # a chat job's ClearToolUses (contract/edits/tool_uses.py)
    trace_context: str = ""  # the API span's W3C traceparent (contract/tracing/); "": not traced
    images: tuple[str, ...] = ()  # the SHA-256 of each image, in its markers' order (contract/media/)
    low_detail: tuple[int, ...] = ()  # the indices in `images` of those read at `detail: low`

    def to_dict(self) -> dict:
        data = asdict(self)
        data["messages"] = [m.to_dict() for m in self.messages]
        for name in ("stop", "images", "low_detail"):
            data[name] = list(data[name])
        data["logit_bias"] = [list(pair) for pair in self.logit_bias]
        data["tools"] = [{k: v for k, v in asdict(t).items() if v is not None} for t in self.tools]
        data["inputs"] = [x if isinstance(x, str) else list(x) for x in self.inputs]
        # an earlier worker takes a spec without them (and a function tool has no "freeform")
        absent_unless_set = ("ignore_eos", "cache_scope", "public_prompt", "template_kwargs", "images")
        absent_unless_set += ("thinking_budget", "inputs", "dimensions", "clear_tool_uses", "trace_context")
        for name in (*absent_unless_set, "low_detail"):
            if not data[name]:
                del data[name]
        return data

    @property
    def uses_tools(self) -> bool:
        """Tools the model may call (with `tool_choice: none` it only sees them)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def named_tool(self) -> str | None:
        """The one tool the model must call (`tool_choice` naming it), if any."""
        return self.tool_choice.removeprefix(NAMED) if self.tool_choice.startswith(NAMED) else None

    @classmethod
    def from_dict(cls, data: object) -> JobSpec:
        if not isinstance(data, dict):
            raise InvalidSpec("job arguments must be an object")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise InvalidSpec(f"unknown job fields: {sorted(extra)}")
        if not isinstance(data.get("inputs", []), list):
            raise InvalidSpec("inputs must be a list")
        try:
            messages = tuple(Message.from_dict(m) for m in data.get("messages", ()))
            tools = tuple(
                Tool(t["name"], t.get("description", ""), t["parameters"], t.get("freeform"))
                for t in data.get("tools", ())
            )
            spec = cls(
                id=data["id"],
                kind=data["kind"],
                model=data["model"],
                messages=messages,
                prompt=data.get("prompt", ""),
                max_tokens=data.get("max_tokens"),
                temperature=data.get("temperature", TEMPERATURE),
                top_p=data.get("top_p", TOP_P),
                stop=tuple(data.get("stop", ())),
                seed=data.get("seed"),
                presence_penalty=data.get("presence_penalty", 0.0),
                frequency_penalty=data.get("frequency_penalty", 0.0),
                top_k=data.get("top_k", 0),
                min_p=data.get("min_p", 0.0),
                repeat_penalty=data.get("repeat_penalty", 1.0),
                logit_bias=tuple((p[0], p[1]) for p in data.get("logit_bias", ())),
                logprobs=data.get("logprobs", False),
                top_logprobs=data.get("top_logprobs", 0),
                response_format=data.get("response_format"),
                tools=tools,
                tool_choice=data.get("tool_choice", "auto"),
                parallel_tool_calls=data.get("parallel_tool_calls", True),
                priority=data.get("priority", "default"),
                ignore_eos=data.get("ignore_eos", False),
                cache_scope=data.get("cache_scope", ""),
                public_prompt=data.get("public_prompt", False),
                template_kwargs=data.get("template_kwargs", {}),
                thinking_budget=data.get("thinking_budget", 0),
                inputs=tuple(x if isinstance(x, str) else tuple(x) for x in data.get("inputs", ())),
                dimensions=data.get("dimensions", 0),
                clear_tool_uses=data.get("clear_tool_uses"),
                trace_context=data.get("trace_context", ""),
                images=tuple(data.get("images", ())),
                low_detail=tuple(data.get("low_detail", ())),
            )
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise InvalidSpec(f"malformed job arguments: {exc!r}") from None
        spec.check()
        return spec

    def check(self) -> None:
        """Raise InvalidSpec unless every field is of the right type and range."""

        def number(name: str, lo: float, hi: float) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSpec(f"{name} must be a number")
            if not math.isfinite(value) or not lo <= value <= hi:
                raise InvalidSpec(f"{name} must be between {lo} and {hi}")

        for name in ("id", "model", "prompt", "cache_scope", "trace_context"):
            if not isinstance(getattr(self, name), str):
                raise InvalidSpec(f"{name} must be a string")
        if not propagation.valid(self.trace_context):
            raise InvalidSpec("trace_context must be a W3C traceparent (and tracestate)")
        if not self.id or not self.model:
            raise InvalidSpec("id and model must not be empty")
        if self.kind not in KINDS:
            raise InvalidSpec(f"kind must be one of {KINDS}")
        if self.priority not in PRIORITIES:
            raise InvalidSpec(f"priority must be one of {PRIORITIES}")
        if self.kind == "chat" and not self.messages:
            raise InvalidSpec("a chat job needs messages")
        if self.max_tokens is not None and not _count(self.max_tokens):
            raise InvalidSpec("max_tokens must be a non-negative integer")
        number("temperature", 0.0, 2.0)
        number("top_p", 0.0, 1.0)
        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidSpec("seed must be an integer")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidSpec("stop strings must be non-empty strings")
        if not _count(self.top_k):
            raise InvalidSpec("top_k must be a non-negative integer")
        number("min_p", 0.0, 1.0)
        number("repeat_penalty", 0.01, 10.0)
        for pair in self.logit_bias:
            token, bias = pair
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidSpec("logit_bias keys must be token ids")
            if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
                raise InvalidSpec("logit_bias values must be between -100 and 100")
        if not all(isinstance(flag, bool) for flag in (self.logprobs, self.ignore_eos, self.public_prompt)):
            raise InvalidSpec("logprobs, ignore_eos and public_prompt must be booleans")
        if self.ignore_eos and (self.response_format or self.uses_tools):
            raise InvalidSpec("ignore_eos cannot go with a response format or tools")
        if problem := template_kwargs_problem(self.template_kwargs):
            raise InvalidSpec(f"template_kwargs: {problem}")
        if not _count(self.thinking_budget):
            raise InvalidSpec("thinking_budget must be a non-negative integer")
        if problem := clear_tool_uses_problem(self.clear_tool_uses):
            raise InvalidSpec(f"clear_tool_uses: {problem}")
        top = self.top_logprobs
        if not _count(top) or top > MAX_TOP_LOGPROBS or (top and not self.logprobs):
            raise InvalidSpec(f"top_logprobs must be 0 to {MAX_TOP_LOGPROBS}, with logprobs")
        self._check_embed()
        self._check_chat()
        contents = (m.content for m in self.messages)
        if problem := media.problem(self.images, contents, self.kind, self.low_detail):
            raise InvalidSpec(problem)

    def _check_embed(self) -> None:
        """Embed jobs' inputs (strings or token ids), rank jobs' (a query, documents): no more."""
        if not _count(self.dimensions):
            raise InvalidSpec("dimensions must be a non-negative integer")
        strings = all(isinstance(x, str) and x for x in self.inputs)
        if self.kind == "rank" and (len(self.inputs) < 2 or not strings or self.dimensions):
            raise InvalidSpec("a rank job's inputs are a query and documents, non-empty strings")
        if self.kind not in ("embed", "rank"):
            if self.inputs or self.dimensions:
                raise InvalidSpec("inputs and dimensions are for embed jobs")
            return
        if not self.inputs or self.messages or self.prompt:
            raise InvalidSpec("an embed job has inputs, and no messages or prompt")
        if not all(isinstance(x, str) or (x and all(_count(t) for t in x)) for x in self.inputs):
            raise InvalidSpec("an input is a string or a non-empty list of token ids")

    def _check_chat(self) -> None:
        """Messages, tools, the tool choice and the response format. The schemas are compiled here. A job
        whose grammar cannot be built is refused here, not in the sampler."""
        for m in self.messages:
            if not all(isinstance(x, str) for x in (m.role, m.content, m.tool_call_id, m.reasoning)):
                raise InvalidSpec("message fields must be strings")
            if m.reasoning and m.role != "assistant":
                raise InvalidSpec("only an assistant's message carries reasoning")
            if m.role not in ROLES:
                raise InvalidSpec(f"message roles must be among {ROLES}")
            if (m.role == "tool") != bool(m.tool_call_id) or (m.tool_calls and m.role != "assistant"):
                raise InvalidSpec("tool messages need a tool_call_id; only assistants make tool calls")
            for call in m.tool_calls:
                if not all(isinstance(x, str) for x in (call.id, call.name, call.arguments)) or not call.id:
                    raise InvalidSpec("tool calls need a string id, name and arguments")
        if self.kind == "text" and (
            self.tools or self.response_format is not None or self.tool_choice != "auto"
        ):
            raise InvalidSpec("tools and response formats are for chat jobs")
        names = []
        for tool in self.tools:
            if not isinstance(tool.name, str) or not TOOL_NAME.fullmatch(tool.name):
                raise InvalidSpec("tool names must be 1 to 64 letters, digits, '_' or '-'")
            if not isinstance(tool.description, str):
                raise InvalidSpec("tool descriptions must be strings")
            _compile(tool.parameters, f"tool {tool.name}")
            if tool.freeform is not None and (problem := custom_tool_problem(tool.parameters, tool.freeform)):
                raise InvalidSpec(f"tool {tool.name}: {problem}")
            names.append(tool.name)
        if len(set(names)) != len(names):
            raise InvalidSpec("tool names must be unique")
        if (
            not isinstance(self.tool_choice, str)
            or (self.tool_choice not in TOOL_CHOICES and self.tool_choice.removeprefix(NAMED) not in names)
            or (self.tool_choice not in TOOL_CHOICES and not self.tool_choice.startswith(NAMED))
        ):
            raise InvalidSpec("tool_choice must be none, auto, required or the name of a tool")
        if self.tool_choice == "required" and not self.tools:
            raise InvalidSpec("tool_choice required needs tools")
        if not isinstance(self.parallel_tool_calls, bool):
            raise InvalidSpec("parallel_tool_calls must be a boolean")
        fmt = self.response_format
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") not in FORMATS:
                raise InvalidSpec(f"response_format type must be one of {FORMATS}")
            if fmt["type"] == "json_schema":
                if set(fmt) != {"type", "schema"}:
                    raise InvalidSpec("a json_schema response_format has a type and a schema")
                _compile(fmt["schema"], "response_format")
            elif set(fmt) != {"type"}:
                raise InvalidSpec("a json_object response_format has a type only")
        if self.logprobs and self.uses_tools:
            raise InvalidSpec("logprobs cannot be combined with tools")


def _compile(schema: object, what: str) -> None:
    try:
        schema_grammar(schema)
    except SchemaError as exc:
        raise InvalidSpec(f"{what}: {exc}") from None


def _count(value: object) -> bool:  # a non-negative integer (a bool is not one)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def template_kwargs_problem(kwargs: object) -> str | None:
    """What is wrong with a chat template's extra arguments (None: nothing). They are an object of at most
    MAX_TEMPLATE_KWARGS names. None is the worker's own or the template's (TEMPLATE_RESERVED). Each value
    is a boolean, a number or a short string. Special tokens' texts in a string render as text
    (worker/tools/outside.py)."""
    if not isinstance(kwargs, dict):
        return "must be an object"
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        return f"at most {MAX_TEMPLATE_KWARGS} names"
    for name, value in kwargs.items():
        if not isinstance(name, str) or not name.isidentifier() or name in TEMPLATE_RESERVED:
            return f"{str(name)[:40]!r} is not a name a request may set"
        if (
            not isinstance(value, bool | int | float | str)
            or (isinstance(value, str) and len(value) > MAX_TEMPLATE_VALUE_CHARS)
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            most = MAX_TEMPLATE_VALUE_CHARS
            return f"{name!r} must be a boolean, a number or a string of at most {most} characters"
    return None
