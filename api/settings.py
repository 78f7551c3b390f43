"""API settings, each declared once with its variable, default and meaning.

The configuration reference, docs/configuration.md, is generated from these declarations.
They come in groups, one per concern. So a handler or a store reads the group it works with
(`settings.quotas`, `settings.batches`, ...)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from api.pool_settings import Batches, Connection, Lifetimes, Routing
from contract.prefixes import public_digest
from contract.settings import Recovery, Shared, group, load, one_of, setting, words


def _per_model(raw: str) -> dict[str, int]:
    """`model=N,other=M` -> {model: N, other: M}."""
    out = {}
    for item in words(raw):
        model, sep, value = item.rpartition("=")
        if not sep or not model.strip() or not value.strip().isdigit():
            raise ValueError(f"QUEUE_LIMITS: expected model=N, got {item!r}")
        out[model.strip()] = int(value)
    return out


def _public_prompts(path: str) -> frozenset[str]:
    """PUBLIC_PROMPTS_FILE: a JSON array of prompts -> their digests (contract/prefixes.py)."""
    try:
        prompts = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"PUBLIC_PROMPTS_FILE: cannot read a JSON array from {path}: {exc}") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("PUBLIC_PROMPTS_FILE: expected a JSON array of non-empty strings")
    return frozenset(public_digest(p) for p in prompts)


@dataclass(frozen=True)
class Access:
    """Who may call the API, and on which port."""

    api_keys: tuple[str, ...] = setting(
        (),
        "API_KEYS",
        "comma-separated accepted keys (clear or `sha256:<hex>`) for `Authorization: Bearer` on "
        "every route but the probes (and the browser pages' static files with `UI=1`)",
        shown="(none: the API refuses to start without keys unless ALLOW_NO_AUTH=1)",
    )
    api_keys_file: str | None = setting(
        None,
        "API_KEYS_FILE",
        "more keys, one per line, re-read when the file changes; after a key, `role=operator`, "
        "`tiers=<tier>,...` (the service tiers it may ask for; by default every one), "
        "`requests_per_minute=N`, `bytes_per_minute=N` and `tokens_per_minute=N` (docs/security.md)",
    )
    operator_keys: tuple[str, ...] = setting(
        (),
        "OPERATOR_KEYS",
        "comma-separated keys (clear or `sha256:<hex>`) that may also read the pool-wide data on "
        "the public port (`/metrics`, `/scaling/<model>`, the pool page); other keys get 403",
        shown="(none)",
    )
    public_prompts: frozenset[str] = setting(
        frozenset(),
        "PUBLIC_PROMPTS_FILE",
        "a JSON array of system prompts made public: a job whose first message (system or "
        "developer) is exactly one shares that message's prompt cache and routing with every key; "
        'the rest of its prompt stays its key\'s (docs/security.md, "Tenancy"); read at start',
        parse=_public_prompts,
        shown="(none)",
    )
    reasoning_seal_secrets: tuple[str, ...] = setting(
        (),
        "REASONING_SEAL_SECRETS",
        "comma-separated secrets (32+ random characters, the same on every replica) sealing Responses' "
        "`reasoning.encrypted_content`: the first seals, all open (to rotate, the new one first)",
        shown="(none: one made once, kept in Redis, `ts:reasoning-seal`)",
    )
    allow_no_auth: bool = setting(
        False,
        "ALLOW_NO_AUTH",
        "`1`: serve without API keys (a private server; the local run sets it). Without keys and "
        "without this, the API refuses to start",
    )
    allowed_hosts: tuple[str, ...] = setting(
        ("localhost", "127.0.0.1", "::1"),
        "ALLOWED_HOSTS",
        "with no API keys (ALLOW_NO_AUTH=1): the Host names the API answers, comma-separated "
        "(`*`: any), against DNS rebinding; and a browser's request that changes anything must "
        "come from the API's own pages or CORS_ORIGINS (api/http/origins.py)",
        shown="`localhost,127.0.0.1,::1`",
    )
    internal_port: int | None = setting(
        None,
        "INTERNAL_PORT",
        "serve `/metrics` and `/scaling/<model>` (and the probes) on this port too, without keys "
        "(for Prometheus and the autoscaler inside the cluster); on the public port they answer "
        "operator keys only",
        shown="(none: on the public port, to operator keys)",
    )
    metrics_keys: int = setting(
        100,
        "METRICS_KEYS",
        "API keys with series of their own in `/metrics` (budget use, refusals; by key id, 12 hex "
        'digits of the key\'s SHA-256), in the order configured; the rest are summed as `key="other"`',
    )
    internal_host: str = setting("0.0.0.0", "INTERNAL_HOST", "the address the internal port listens on")
    cors_origins: tuple[str, ...] = setting(
        (),
        "CORS_ORIGINS",
        "comma-separated browser origins allowed to call the API",
        shown="(none: CORS off)",
    )
    ui: bool = setting(
        False,
        "UI",
        "`1`: serve the playground at `/` and the pool view at `/pool` (static pages; their calls "
        "need a key like any client's; the local run sets it)",
    )


@dataclass(frozen=True)
class Limits:
    """Per-request ceilings. The prompt's length in tokens is checked by the worker, against
    the model's context (`context_length_exceeded`)."""

    max_body_bytes: int = setting(1_000_000, "MAX_BODY_BYTES", "larger request bodies get 413")
    request_read_s: float = setting(
        30.0, "REQUEST_READ_SECONDS", "a request body not received within this is refused (408)"
    )
    max_messages: int = setting(512, "MAX_MESSAGES", "messages per chat request (400)")
    max_prompt_chars: int = setting(500_000, "MAX_PROMPT_CHARS", "characters of prompt per request (400)")
    max_tokens: int = setting(
        8192,
        "MAX_TOKENS_LIMIT",
        "ceiling for a completion's `max_tokens` (400; a larger one is clamped to it on chat completions "
        "and the Messages API, where agents ask 32,000)",
    )
    max_stop: int = setting(4, "MAX_STOP", "stop sequences per request (400)")
    max_images: int = setting(
        8, "MAX_IMAGES", "images per request, on a model whose workers read images (400 naming the part)"
    )
    max_image_bytes: int = setting(
        5_000_000,
        "MAX_IMAGE_BYTES",
        "bytes of one image, decoded (400 naming the part; MAX_BODY_BYTES bounds all)",
    )
    max_image_pixels: int = setting(
        16_777_216,
        "MAX_IMAGE_PIXELS",
        "pixels of one image, width x height from its header (400 naming the part)",
    )
    image_url_hosts: tuple[str, ...] = setting(
        (),
        "IMAGE_URL_HOSTS",
        "comma-separated hosts whose `http(s)` image URLs the API fetches before queueing the job "
        "(`*.example.com`: its subdomains). A host's address is resolved once and must be public; "
        "an IP address listed here names itself, the only way to a private one. Each redirect is "
        "checked the same way",
        shown="(none: remote image URLs are a 400)",
    )
    image_url_s: float = setting(
        10.0, "IMAGE_URL_SECONDS", "time to fetch one remote image, its redirects included (400)"
    )
    max_stop_chars: int = setting(256, "MAX_STOP_CHARS", "characters per stop sequence (400)")
    max_embedding_inputs: int = setting(
        2048, "MAX_EMBEDDING_INPUTS", "inputs per `/v1/embeddings` request (400; OpenAI's limit)"
    )
    max_embedding_tokens: int = setting(
        65_536,
        "MAX_EMBEDDING_TOKENS",
        "tokens per `/v1/embeddings` request, the bound on one request's work (400 naming "
        "`input`, before it is enqueued): token arrays count their ids, strings their UTF-8 bytes "
        "and 4 (no text has more tokens); 32 decodes of EMBEDDING_BATCH_TOKENS (docs/embeddings.md)",
    )
    max_rerank_documents: int = setting(
        1000, "MAX_RERANK_DOCUMENTS", "documents per `/v1/rerank` request (400; Cohere's limit)", minimum=1
    )
    rerank_raw_scores: bool = setting(
        False,
        "RERANK_RAW_SCORES",
        "`1`: `/v1/rerank` answers the model's raw scores (llama-server's); off: their sigmoid, in "
        "0..1 as Cohere's are (what relevance thresholds expect); a job keeps the one it was "
        "created with",
        shown="off",
    )
    matryoshka_models: tuple[str, ...] = setting(
        (),
        "MATRYOSHKA_MODELS",
        "comma-separated embedding models trained for shorter vectors (Matryoshka): only these "
        "take `dimensions` (GGUF does not say; 400 for others)",
    )


REASONING_FIELDS = ("reasoning_content", "reasoning", "both")


@dataclass(frozen=True)
class Replies:
    """How answers say what the worker found (worker: REASONING_FORMAT). Also which tools they offer."""

    reasoning_field: str = setting(
        "reasoning_content",
        "REASONING_FIELD",
        "the chat field a reasoning model's thinking streams in: `reasoning_content` (DeepSeek's, "
        "read by OpenCode and openai-php), `reasoning` (vLLM's and Ollama's), or `both`; a job "
        "keeps the one it was created with",
        parse=one_of("REASONING_FIELD", REASONING_FIELDS),
    )
    hosted_tools: str = setting(
        "omit",
        "HOSTED_TOOLS",
        "a Responses request naming a built-in tool (`web_search`, `mcp`...: none runs here): `omit`, "
        "it is not offered (the Response's `tools`, its `x-omitted-tools` header say so); `refuse`, 400",
        parse=one_of("HOSTED_TOOLS", ("omit", "refuse")),
    )


@dataclass(frozen=True)
class Quotas:
    """What one API key may hold and spend (`0`: no limit). Limits hold across replicas unless
    said otherwise."""

    max_jobs_per_key: int = setting(64, "MAX_JOBS_PER_KEY", "unfinished jobs per API key (429)")
    max_streams_per_key: int = setting(
        64, "MAX_STREAMS_PER_KEY", "open streams per API key, per API process (429)"
    )
    key_requests_per_minute: int = setting(
        600, "KEY_REQUESTS_PER_MINUTE", "jobs and uploads one API key may make per minute (429)"
    )
    key_bytes_per_minute: int = setting(
        50_000_000, "KEY_BYTES_PER_MINUTE", "request bytes one API key may send per minute (429)"
    )
    key_tokens_per_minute: int = setting(
        0,
        "KEY_TOKENS_PER_MINUTE",
        "prompt and completion tokens one API key may use per minute, every endpoint's (429): a "
        "job reserves the most its prompt can be and its `max_tokens` when admitted, and is charged "
        'its usage when it ends (docs/security.md, "Token limits")',
    )
    cached_token_weight: float = setting(
        1.0,
        "CACHED_TOKEN_WEIGHT",
        "what one prompt token read from the prompt cache counts against `KEY_TOKENS_PER_MINUTE` "
        "(`1`: a full token, as OpenAI counts them; `0`: nothing)",
        minimum=0,
    )
    files_bytes_per_key: int = setting(
        100_000_000,
        "FILES_BYTES_PER_KEY",
        "bytes one key may hold in files and running batches (413): its uploads, its batches' "
        "lines and answers while they run, and their output and error files "
        '(docs/security.md, "Amplification")',
    )
    max_files_per_key: int = setting(1000, "MAX_FILES_PER_KEY", "files one key may hold (413)")
    max_batches_per_key: int = setting(
        16, "MAX_BATCHES_PER_KEY", "batches one API key may have running (429)"
    )


@dataclass(frozen=True)
class Intake:
    """When a model's queue takes a new job, and when it pushes back."""

    known_models: tuple[str, ...] = setting(
        (),
        "KNOWN_MODELS",
        "comma-separated models accepted with no live worker (they scale from zero); a model's "
        "embedding pool is `<model>#embed`",
    )
    max_queue_depth: int = setting(
        1000, "MAX_QUEUE_DEPTH", "waiting jobs per model before 429 `queue_full` (`0`: no limit)"
    )
    queue_limits: dict[str, int] = setting(
        {}, "QUEUE_LIMITS", "per-model overrides of `MAX_QUEUE_DEPTH`, `model=N,other=M`", parse=_per_model
    )
    prompt_chars_per_token: int = setting(
        16,
        "PROMPT_CHARS_PER_TOKEN",
        "a prompt longer than this many characters per token of its model's context (the smallest "
        "its live workers announce, or the last one announced when none is live) is refused "
        "before it is stored (400)",
        minimum=1,
    )
    redis_memory_high: float = setting(
        0.9,
        "REDIS_MEMORY_HIGH",
        "new jobs are refused (503 `storage_full`) once Redis uses this share of its `maxmemory`",
    )
    retry_after_s: int = setting(
        5,
        "RETRY_AFTER_SECONDS",
        "`Retry-After` sent with 429 (a key's per-minute budgets: when its minute ends)",
    )

    def queue_limit(self, model: str) -> int:
        return self.queue_limits.get(model, self.max_queue_depth)


@dataclass(frozen=True)
class Settings:
    shared: Shared = group(Shared)
    recovery: Recovery = group(Recovery)
    access: Access = group(Access)
    limits: Limits = group(Limits)
    replies: Replies = group(Replies)
    quotas: Quotas = group(Quotas)
    intake: Intake = group(Intake)
    batches: Batches = group(Batches)
    routing: Routing = group(Routing)
    lifetimes: Lifetimes = group(Lifetimes)
    connection: Connection = group(Connection)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        return load(cls, os.environ if env is None else env)
