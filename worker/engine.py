"""The model: llama-cpp-python, loaded once per worker process.

The engine turns a job into prompt token ids (with the GGUF's own chat template) and then
into a stream of (token id, bytes) pairs. It knows nothing of Redis or of the stream
contract; `worker.jobs` decides when to stop and what to publish. Sampling follows OpenAI's
semantics: temperature and top_p as given, no hidden top-k or min-p, temperature 0 greedy.
"""

from __future__ import annotations

import ctypes
import secrets
from collections.abc import Iterator, Sequence

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from contract.jobspec import JobSpec
from worker.errors import PromptRejected, PromptTooLong
from worker.settings import WorkerSettings

# Private-use code points: no template or tokenizer gives them a meaning.
_PLACEHOLDER = "\ue000tokenspool-message-{}\ue001"


class LlamaEngine:
    def __init__(self, settings: WorkerSettings) -> None:
        self.model_name = settings.model_name
        self._llm = Llama(
            model_path=str(settings.model_path),
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            n_threads_batch=settings.n_threads,
            n_gpu_layers=settings.n_gpu_layers,
            verbose=False,
        )
        self.n_ctx = self._llm.n_ctx()
        self._model = self._llm._model
        template = self._llm.metadata.get("tokenizer.chat_template")
        self._formatter = (
            Jinja2ChatFormatter(
                template=template,
                eos_token=self._token_text(self._model.token_eos()),
                bos_token=self._token_text(self._model.token_bos()),
                add_generation_prompt=True,
            )
            if template
            else None
        )

    def _token_text(self, token: int) -> str:
        return self._model.token_get_text(token) if token >= 0 else ""

    def prompt_ids(self, spec: JobSpec) -> list[int]:
        """The prompt as the model sees it; raises PromptTooLong if nothing fits after it."""
        param = "messages" if spec.kind == "chat" else "prompt"
        if spec.kind == "chat":
            ids = self._chat_ids(spec)
        else:
            # A raw prompt is the caller's own text, special tokens included, as llama.cpp does.
            ids = self._llm.tokenize(spec.prompt.encode(), add_bos=self._model.add_bos_token(), special=True)
        if len(ids) >= self.n_ctx:
            raise PromptTooLong(len(ids), self.n_ctx, param)
        return ids

    def _render(self, spec: JobSpec, contents: Sequence[str] | None = None) -> str:
        """The chat template rendered with the generation prompt (contents replaceable)."""
        if self._formatter is None:
            raise PromptRejected("This model has no chat template; use /v1/completions.", "messages")
        texts = contents if contents is not None else [m.content for m in spec.messages]
        messages = [{"role": m.role, "content": t} for m, t in zip(spec.messages, texts, strict=True)]
        return self._formatter(messages=messages).prompt

    def _chat_ids(self, spec: JobSpec) -> list[int]:
        """Only the template's own markers become special tokens: each message's content is
        tokenized as plain text, so a user who types `<|im_end|>` cannot forge a role
        boundary. The template is rendered with placeholders where the contents go, its text
        tokenized with special tokens, the contents without."""
        marks = [_PLACEHOLDER.format(i) for i in range(len(spec.messages))]
        rest = self._render(spec, marks)
        ids: list[int] = []
        for mark, message in zip(marks, spec.messages, strict=True):
            before, found, rest = rest.partition(mark)
            if not found:
                raise PromptRejected(
                    "This model's chat template alters message contents; it cannot be used safely.",
                    "messages",
                )
            ids += self._tokens(before, special=True)
            ids += self._tokens(message.content, special=False)
        return ids + self._tokens(rest, special=True)

    def _tokens(self, text: str, special: bool) -> list[int]:
        return self._llm.tokenize(text.encode(), add_bos=False, special=special) if text else []

    def is_end(self, token: int) -> bool:
        """End-of-generation tokens (EOS, end-of-turn, ...): never published."""
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    def piece(self, token: int) -> bytes:
        """The token's bytes (control tokens render as nothing). llama-cpp-python's own
        `token_to_piece` returns its whole 32-byte buffer, NUL padding included."""
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def tokens(self, spec: JobSpec, context: Sequence[int]) -> Iterator[tuple[int, bytes]]:
        """Sample after `context` until the context window is full (the caller stops earlier)."""
        seed = secrets.randbits(32) if spec.seed is None else spec.seed & 0xFFFFFFFF
        self._llm.set_seed(seed)
        # Always prefill from scratch. llama-cpp-python's prefix reuse (keeping the previous
        # job's KV cache for a shared prefix) changes what is sampled: the same request with
        # the same seed gave different tokens from its first one (tests/integration).
        self._llm.reset()
        room = self.n_ctx - len(context)
        for n, token in enumerate(
            self._llm.generate(
                list(context),
                top_k=0,
                top_p=spec.top_p,
                min_p=0.0,
                temp=spec.temperature,
                repeat_penalty=1.0,
                frequency_penalty=spec.frequency_penalty,
                presence_penalty=spec.presence_penalty,
                reset=True,
            )
        ):
            yield token, self.piece(token)
            if n + 1 >= room:
                return
