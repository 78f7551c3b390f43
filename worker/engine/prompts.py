"""Prompts as token ids, and token ids as bytes, with the GGUF's own vocabulary and template.

A chat job is rendered with the chat template the GGUF carries. Only the template's own
markers become special tokens (see `ChatPrompts.prompt_ids`). The client's other strings it
renders keep any special token's text as text (worker/tools/outside.py). Tools, tool calls
and tool results are rendered the way the template's tool protocol says
(worker/tools/protocols.py). A raw prompt is the caller's own text, special tokens included,
as llama.cpp does. Nothing here touches the KV cache. So the batching engine's job threads
may call it while the scheduler decodes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import re
from collections.abc import Callable, Sequence

import llama_cpp
from llama_cpp._internals import LlamaModel
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from contract.jobspec import JobSpec, Message, Tool, ToolCall
from contract.media.images import MARKER
from contract.prefixes import PromptOverhead
from worker.engine.steps.plan import common_prefix
from worker.engine.vision import encoder
from worker.engine.vision.prompt import IMAGE
from worker.errors import PromptRejected, PromptTooLong
from worker.tools import clearing, late_system, outside
from worker.tools.json_envelope import JsonTools
from worker.tools.protocols import ToolProtocol, detect

_PLACEHOLDER = outside.OPEN + "tokenspool-message-{}" + outside.CLOSE
# read as text only
_SPECIAL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN


# What `ChatPrompts.overhead` renders: a conversation, the same with more, and how many parts
# the API counts in what was added (a message, each of its tool calls).
_USER = Message("user", "a")
_ANSWER = Message("assistant", "a")
_CALL = ToolCall("call_a", "a", "{}")
_CALLING = Message("assistant", "", tool_calls=(_CALL,))
_FORMAT = {"type": "json_schema", "schema": {"type": "object"}}
_SHAPES: tuple[tuple[tuple[Message, ...], tuple[Message, ...], int], ...] = (
    ((_USER,), (Message("system", "a"), _USER), 1),
    ((_USER,), (_USER, _ANSWER), 1),
    ((_USER,), (_USER, Message("assistant", "a", reasoning="a")), 1),
    ((_USER, _ANSWER), (_USER, _ANSWER, _USER), 1),
    ((_USER,), (_USER, _CALLING), 2),
    ((_USER, _CALLING), (_USER, Message("assistant", "", tool_calls=(_CALL, _CALL))), 1),
    ((_USER, _CALLING), (_USER, _CALLING, Message("tool", "a", tool_call_id="call_a")), 1),
)


class ChatPrompts:
    def __init__(self, model: LlamaModel, template: str | None = None) -> None:
        self._model = model
        # MMPROJ_PATH's (worker/engine/vision/)
        self.vision: encoder.Encoder | None = None
        # an image's bytes by its cache scope and hash: the worker's Redis (worker/__main__.py)
        self.fetch_image: Callable[[str, str], bytes | None] = lambda scope, sha: None
        template = template or model.metadata().get("tokenizer.chat_template")
        self._formatter = (
            Jinja2ChatFormatter(
                template=template,
                eos_token=self._token_text(model.token_eos()),
                bos_token=self._token_text(model.token_bos()),
                add_generation_prompt=True,
            )
            if template
            else None
        )
        self.tools: ToolProtocol = (
            detect(lambda **kw: self._formatter(**kw).prompt, template)
            if self._formatter and template
            else JsonTools()
        )
        n_vocab = llama_cpp.llama_vocab_n_tokens(model.vocab)
        self.ends = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(model.vocab, t)]
        # control tokens that do not end generation: banned where a grammar decides
        self.controls = [
            t
            for t in range(n_vocab)
            if self._attr(t) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
            and not llama_cpp.llama_vocab_is_eog(model.vocab, t)
        ]
        # and the markers a format renders as text (harmony's `<|channel|>`...): user-defined tokens
        marks = [
            text
            for t in range(n_vocab)
            if self._attr(t) & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
            and (text := self._token_text(t)).startswith("<|")
            and text.endswith("|>")
        ]
        # what tokenizing with special tokens reads as a token and without them as text: every
        # control token's text (end of generation included), and the format's markers
        specials = [self._token_text(t) for t in range(n_vocab) if self._attr(t) & _SPECIAL]
        self._outside = outside.Masker(specials + marks)
        # tokens rendered as their text (harmony's: worker/engine/model.py)
        self.markers: dict[int, bytes] = {}
        # llama.cpp matches user-defined tokens in any text, special or not: contents split them
        self._marks = re.compile("|".join(map(re.escape, marks))) if marks else None

    def _token_text(self, token: int) -> str:
        return self._model.token_get_text(token) if token >= 0 else ""

    def _attr(self, token: int) -> int:
        return llama_cpp.llama_vocab_get_attr(self._model.vocab, token)

    def prompt_ids(self, spec: JobSpec, n_ctx: int) -> list[int]:
        """The prompt as the model sees it. Raises PromptTooLong if nothing fits after it."""
        param = "messages" if spec.kind == "chat" else "prompt"
        if spec.kind == "chat":
            ids = self._chat_ids(spec)
        else:
            ids = self._model.tokenize(
                spec.prompt.encode(), add_bos=self._model.add_bos_token(), special=True
            )
        if len(ids) >= n_ctx:
            raise PromptTooLong(len(ids), n_ctx, param)
        # each IMAGE becomes its image
        if spec.images:
            return encoder.prompt_of(self.vision, spec, ids, n_ctx, self.fetch_image)
        return ids

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        """The job as its context edit leaves it (worker/tools/clearing.py), and what the edit cleared.

        What it cleared is (tool uses, input tokens), each token counted as the prompt renders it."""
        if spec.kind != "chat" or spec.clear_tool_uses is None:
            return spec, (0, 0)
        before = len(self._chat_ids(spec))
        edited, uses = clearing.clear_tool_uses(spec, before, lambda text: len(self._plain(text)))
        return edited, (uses, before - len(self._chat_ids(edited)) if uses else 0)

    def _chat_ids(self, spec: JobSpec) -> list[int]:
        """The prompt of a chat job.

        A template may refuse (or drop) a system message after the first turn. Then it gets
        the message as marked text of a user turn (worker/tools/late_system.py)."""
        try:
            return self._rendered_ids(spec)
        except Exception:
            if not late_system.is_late(spec.messages):
                raise
        return self._rendered_ids(dataclasses.replace(spec, messages=late_system.folded(spec.messages)))

    def _rendered_ids(self, spec: JobSpec) -> list[int]:
        """Each message's content is tokenized as plain text.

        So a user who types `<|im_end|>` cannot forge a role boundary. The template is
        rendered with placeholders where the contents go. Its text is tokenized with special
        tokens, the contents without. The template also renders client strings outside the
        contents. They are a tool's schema, a call's arguments, reasoning and template kwargs.
        Their special tokens' texts are marked (worker/tools/outside.py). So those are
        tokenized as text too."""
        if self._formatter is None:
            raise PromptRejected("This model has no chat template; use /v1/completions.", "messages")
        messages, extra = self.tools.messages(spec)
        # An empty content stays empty (a template may render "no content" differently).
        holders = [_PLACEHOLDER.format(i) if m["content"] else "" for i, m in enumerate(messages)]
        marks: dict[str, int] = {}
        rendered = [
            {k: holder if k == "content" else self._outside.value(v, marks) for k, v in m.items()}
            for m, holder in zip(messages, holders, strict=True)
        ]
        kwargs = self._outside.value({**extra, **spec.template_kwargs}, marks)
        rest = self._render(spec, rendered, kwargs)  # type: ignore[arg-type]
        texts = list(marks)
        ids: list[int] = []
        for holder, message in zip(holders, messages, strict=True):
            if not holder:
                continue
            before, found, rest = rest.partition(holder)
            if not found:
                raise PromptRejected(
                    "This model's chat template alters message contents; it cannot be used safely.",
                    "messages",
                )
            ids += self._template(before, texts)
            ids += self._content(message["content"], bool(spec.images))
        return ids + self._template(rest, texts)

    def _render(self, spec: JobSpec, messages: list[dict], kwargs: dict) -> str:
        """The template's text.

        A template may fail on a request. It may call its own `raise_exception`, or get a kwarg
        of a type it cannot use. Then the request is rejected. The error names
        `chat_template_kwargs` if the template renders without them."""
        try:
            return self._formatter(messages=messages, **kwargs).prompt  # type: ignore[misc]
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        own = {k: v for k, v in kwargs.items() if k not in spec.template_kwargs}
        if spec.template_kwargs and self._renders(messages, own):
            raise PromptRejected(
                f"Invalid 'chat_template_kwargs': this model's chat template cannot render them ({why}).",
                "chat_template_kwargs",
            )
        raise PromptRejected(f"This model's chat template cannot render these messages ({why}).", "messages")

    def _renders(self, messages: list[dict], kwargs: dict) -> bool:
        try:
            self._formatter(messages=messages, **kwargs)  # type: ignore[misc]
        except Exception:
            return False
        return True

    def _template(self, text: str, texts: list[str]) -> list[int]:
        """The template's own text with special tokens, the client's text it holds without."""
        ids: list[int] = []
        for piece, theirs in outside.pieces(text, texts):
            ids += self._plain(piece) if theirs else self._tokens(piece, special=True)
        return ids

    def public_tokens(self, spec: JobSpec, prompt: Sequence[int]) -> int:
        """How many of the prompt's first tokens are its public first message's.

        They are those it shares with that message's own head (`_public_head`). The head is
        rendered without the job's tools and template kwargs (contract/prefixes.py). Those are the
        job's scope's own. A template that renders them before the message shares less. The
        count is 0 but for a job the API marked `public_prompt`."""
        if not spec.public_prompt or spec.kind != "chat" or not spec.messages:
            return 0
        return common_prefix(self._public_head(spec.messages[0], spec.model), list(prompt))

    @functools.lru_cache(maxsize=32)  # noqa: B019 (one engine a process; a public prompt is reused)
    def _public_head(self, message: Message, model: str) -> list[int]:
        """The tokens a public message renders as whatever follows it.

        They are what its render alone shares with its render beside a tool and before another
        message. So a key that sends it without tools reads as much of another key's cache.
        That holds whether that key sent tools or not."""
        alone = JobSpec(id="public", kind="chat", model=model, messages=(message,))
        heads = []
        for spec in (alone, dataclasses.replace(alone, tools=(Tool("a"),))):
            for more in ((), (_USER,)):
                try:
                    heads.append(self._chat_ids(dataclasses.replace(spec, messages=(message, *more))))
                # a template that will not render this: nothing shared
                except Exception:
                    return []
        return heads[0][: min(common_prefix(heads[0], h) for h in heads)]

    def marker_ids(self, texts: Sequence[str]) -> dict[int, bytes]:
        """Token id -> text of those of `texts` that are each one token. It is {} unless all are."""
        ids = {text: self._tokens(text, special=True) for text in texts}
        if not all(len(i) == 1 and self._token_text(i[0]) == text for text, i in ids.items()):
            return {}
        return {i[0]: text.encode() for text, i in ids.items()}

    def special_text(self, text: str) -> list[int]:
        """Text the worker writes itself (a thinking block's close), control tokens parsed."""
        return self._tokens(text, special=True)

    def _content(self, text: str, images: bool) -> list[int]:
        """A message's content as plain text.

        In a job with images, each image marker becomes IMAGE. The engine replaces it with the
        image (worker/engine/vision/)."""
        if not images:
            return self._plain(text)
        ids: list[int] = []
        for i, piece in enumerate(text.split(MARKER)):
            ids += ([IMAGE] if i else []) + (self._plain(piece) if piece else [])
        return ids

    def _plain(self, text: str) -> list[int]:
        """A message's content as text only.

        A format's marker in it is tokenized in two parts, neither of them a marker.
        `<|end|>` is one: llama.cpp would read it as its token even without special tokens.
        So no content forges a message boundary."""
        if self._marks is None or not self._marks.search(text):
            return self._tokens(text, special=False)
        ids, at = [], 0
        for found in self._marks.finditer(text):
            mark = found.group()
            ids += self._tokens(text[at : found.start()], special=False)
            ids += self._tokens(mark[:1], special=False) + self._tokens(mark[1:], special=False)
            at = found.end()
        return ids + self._tokens(text[at:], special=False)

    def _tokens(self, text: str, special: bool) -> list[int]:
        return self._model.tokenize(text.encode(), add_bos=False, special=special) if text else []

    def is_end(self, token: int) -> bool:
        """End-of-generation tokens (EOS, end-of-turn, ...): never published."""
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    def piece(self, token: int) -> bytes:
        """The token's bytes.

        Control tokens render as nothing. A harmony marker renders as its text, whatever
        llama.cpp's version makes of it. The reply splits on them. Not llama-cpp-python's own
        `token_to_piece`: it returns its whole 32-byte buffer, NUL padding included."""
        if token in self.markers:
            return self.markers[token]
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def overhead(self, model: str) -> PromptOverhead:
        """What this template adds to a prompt beyond the client's strings.

        It is announced with the worker (contract/prefixes.py `PromptOverhead`). It renders a
        few small conversations, each one part more than another. A part is a message of each
        role, or a tool call. It takes the most a part added beyond its own strings' tokens.
        A conversation the template refuses is left out: no job can send it. Some templates
        take no system message, or need roles that alternate."""

        def ids(messages: tuple[Message, ...], **fields: object) -> int | None:
            spec = JobSpec(id="overhead", kind="chat", model=model, messages=messages, **fields)
            try:
                return len(self._chat_ids(spec))
            # the template refuses this conversation: no job sends it
            except Exception:
                return None

        def own(messages: tuple[Message, ...]) -> int:
            """The tokens of the client's strings in `messages` (not the template's)."""
            texts = [t for m in messages for t in (m.content, m.reasoning, m.tool_call_id) if t]
            texts += [t for m in messages for c in m.tool_calls for t in (c.id, c.name, c.arguments)]
            return sum(len(self._tokens(t, special=False)) for t in texts)

        base = ids((_USER,))
        if base is None:
            return PromptOverhead(0, 0)
        fixed = base - own((_USER,))
        for more in (ids((_USER,), tools=(Tool("a"),)), ids((_USER,), response_format=_FORMAT)):
            if more is not None:
                # a tool protocol's or a response format's instructions
                fixed += max(0, more - base)
        per_part = 0
        for smaller, whole, parts in _SHAPES:
            before, after = ids(smaller), ids(whole)
            if before is not None and after is not None:
                added = after - before - (own(whole) - own(smaller))
                per_part = max(per_part, -(-added // parts))
        return PromptOverhead(fixed=max(0, fixed), per_part=per_part)
