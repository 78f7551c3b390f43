"""Whether a new job may enter a model's queue. The model must be served, or allowed to
scale from zero. Its queue must have room. The caller's key must be under its limits. A
refusal enqueues nothing."""

from __future__ import annotations

import collections
import contextlib
import functools
from dataclasses import dataclass

import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.http.auth import Grant
from api.http.errors import APIError, invalid
from api.http.ratelimits import Budgets, headers, retry_after_s
from api.jobs.memory import MemoryWatch
from api.jobs.owners import this_minute
from api.jobs.workers import WorkerRegistry
from api.settings import Intake, Quotas
from contract import errors, keys, tiers
from contract.entries import as_text
from contract.lua import accounting, queues
from contract.prefixes import UNKNOWN, PromptOverhead

# a place held for a request lasts this long unless its enqueue takes it
RESERVATION_S = 10.0


class OpenStreams:
    """The SSE streams this process relays, per API key (for MAX_STREAMS_PER_KEY). A
    stream's place is taken when it is admitted, before anything is awaited. So a burst of
    requests cannot overshoot the limit. The place is given back when the stream ends, or is
    never sent."""

    def __init__(self) -> None:
        self._by_owner: collections.Counter[str] = collections.Counter()

    def count(self, owner: str) -> int:
        return self._by_owner[owner]

    def take(self, owner: str) -> StreamTicket:
        self._by_owner[owner] += 1
        return StreamTicket(self, owner)

    def _give_back(self, owner: str) -> None:
        self._by_owner[owner] -= 1
        if self._by_owner[owner] <= 0:
            del self._by_owner[owner]


class StreamTicket:
    """One admitted stream's place. `release` is idempotent. A ticket dropped unreleased (a
    response never sent) gives its place back when it is collected."""

    def __init__(self, streams: OpenStreams, owner: str) -> None:
        self._streams, self._owner, self._held = streams, owner, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._streams._give_back(self._owner)

    def __del__(self) -> None:
        self.release()


@dataclass(frozen=True)
class ModelLimits:
    """What a model's workers announced that bounds a job's tokens."""

    # the largest context per job (0: none announced): no job uses more tokens
    context: int
    # the most a worker's chat template adds to a prompt
    overhead: PromptOverhead
    # the most tokens an image becomes on a worker (0: none of them reads images)
    vision: int = 0

    @classmethod
    def of(cls, contexts: list, overheads: list, visions: tuple | list = ()) -> ModelLimits:
        """From the workers' announcements (contract.keys.context, prompt_overhead, worker_vision)."""
        announced = [o for o in (PromptOverhead.parse(as_text(v)) for v in overheads) if o]
        overhead = functools.reduce(PromptOverhead.most, announced) if announced else UNKNOWN
        return cls(max((int(c) for c in contexts), default=0), overhead, max(map(int, visions), default=0))

    def cap(self, tokens: int) -> int:
        """`tokens`, but no more than the context holds."""
        return min(tokens, self.context) if self.context else tokens


class Admission:
    def __init__(
        self,
        client: aredis.Redis,
        registry: WorkerRegistry,
        streams: OpenStreams,
        memory: MemoryWatch,
        intake: Intake,
        quotas: Quotas,
    ) -> None:
        self._r = client
        self._registry = registry
        self._streams = streams
        self._memory = memory
        self._intake, self._quotas = intake, quotas
        self._reserve = client.register_script(queues.RESERVE)
        self._spend = client.register_script(accounting.SPEND)

    async def models(self, names: list[str] | None = None) -> dict[str, int]:
        """Model -> live workers, for the models a client may ask for. These are the models
        with a worker that announced itself recently, and the configured KNOWN_MODELS. A
        known model may have 0 workers: it scales from zero, and its jobs wait in the
        queue."""
        live = await self._registry.live_models(names)
        known = [m for m in self._intake.known_models if names is None or m in names]
        return {**dict.fromkeys(known, 0), **live}

    def storage(self) -> None:
        """503 (with Retry-After) once Redis is nearly full. New work of any kind (a job, a
        file, a batch) waits. What is running keeps room to finish."""
        if self._memory.full:
            raise APIError(errors.STORAGE_FULL, headers={"Retry-After": str(self._intake.retry_after_s)})

    async def model(self, model: str, request_id: str, prompt: tuple[int, str]) -> ModelLimits:
        """Admit a new job for `model`, in one round trip. Refuse with 404 if nobody serves
        it, and 503 when Redis is nearly full. Refuse with 400 a prompt too long for the
        context of its workers. Refuse with 429 (with Retry-After) when its queues are full.
        Else a place is held for `request_id` in the queues. The depth check holds it in the
        same step, so replicas cannot overshoot. Its enqueue takes the place, or `release`
        gives it back. Returns what bounds the job's tokens."""
        self.storage()
        hold_ms = int(RESERVATION_S * 1000)
        async with self._r.pipeline(transaction=False) as pipe:
            self._registry.count_live(pipe, model)
            self._registry.contexts(pipe, model)
            self._registry.overheads(pipe, model)
            self._registry.visions(pipe, model)
            await self._reserve(
                keys=[*keys.interactive_queue_keys(model), keys.routed(model), keys.reserved(model)],
                args=[self._intake.queue_limit(model), request_id, hold_ms],
                client=pipe,
            )
            workers, contexts, overheads, visions, (held, depth) = await pipe.execute()
        try:
            if not workers and model not in self._intake.known_models:
                raise not_found(model)
            self._check_prompt(prompt, [int(c) for c in contexts])
        except APIError:
            if held:
                await self.release(model, request_id)
            raise
        if not held:
            raise self._too_many(
                errors.QUEUE_FULL,
                f"The queue for '{model}' is full ({depth} requests waiting); retry after "
                f"{self._intake.retry_after_s} seconds.",
            )
        return ModelLimits.of(contexts, overheads, visions)

    async def release(self, model: str, request_id: str) -> None:
        """Give back the place `model` held for a request that will not be enqueued."""
        with contextlib.suppress(RedisError):
            await self._r.zrem(keys.reserved(model), request_id)

    def _check_prompt(self, prompt: tuple[int, str], contexts: list[int]) -> None:
        """A prompt far longer than any worker's context could hold is refused here, before
        it is stored. The worker still counts its tokens exactly."""
        chars, param = prompt
        if not contexts:
            # no worker ever announced one: MAX_PROMPT_CHARS alone applies
            return
        limit = self._intake.prompt_chars_per_token * min(contexts)
        if chars > limit:
            raise invalid(
                f"Invalid '{param}': the prompt is {chars} characters long; this model's context "
                f"holds {min(contexts)} tokens, so at most {limit} characters are accepted.",
                param=param,
                error=errors.STRING_TOO_LONG,
            )

    def stream(self, owner: str) -> StreamTicket:
        """Take a stream's place. Raise 429 when this API key already holds
        MAX_STREAMS_PER_KEY open streams on this API process. The count is per process: N
        replicas allow up to N times as many. Without API keys there is no per-key limit.
        Nothing is awaited between the check and the taking."""
        limit = self._quotas.max_streams_per_key
        open_streams = self._streams.count(owner)
        if owner and limit > 0 and open_streams >= limit:
            raise self._too_many(
                errors.TOO_MANY_STREAMS,
                f"Too many open streams for this API key ({open_streams}; the limit is {limit}).",
            )
        return self._streams.take(owner)

    def budgets(self, grant: Grant | None = None) -> Budgets:
        """What a key may use a minute. Its grant may set its own budgets. Else
        KEY_REQUESTS_PER_MINUTE, KEY_BYTES_PER_MINUTE and KEY_TOKENS_PER_MINUTE apply. A
        budget of 0 is no budget."""
        q = self._quotas
        own = grant or Grant()
        return Budgets(
            q.key_requests_per_minute if own.requests_per_minute is None else own.requests_per_minute,
            q.key_bytes_per_minute if own.bytes_per_minute is None else own.bytes_per_minute,
            q.key_tokens_per_minute if own.tokens_per_minute is None else own.tokens_per_minute,
        )

    async def spend(self, owner: str, size: int, grant: Grant | None = None) -> None:
        """Count one request of `size` bytes against its owner's per-minute budgets. These
        are the budgets its jobs count against (contract.lua.accounting.ADMIT). The count
        comes before the request's heavy work (an upload, a batch). Raise 429 if the request
        is over them. Without keys there are no budgets."""
        budgets = self.budgets(grant)
        if not owner or not (budgets.requests_per_minute or budgets.bytes_per_minute):
            return
        minute = this_minute()
        verdict = await self._spend(
            keys=[keys.requests_per_minute(owner, minute), keys.bytes_per_minute(owner, minute)],
            args=[budgets.requests_per_minute, budgets.bytes_per_minute, size],
        )
        # over the requests: all of them are counted; over the bytes: not known
        if verdict[0] == b"rate":
            what = as_text(verdict[1])
            raise self.rate(what, grant, requests=budgets.requests_per_minute if what == "requests" else None)

    def rate(
        self,
        what: str,
        grant: Grant | None = None,
        requests: int | None = None,
        tokens: int | None = None,
        asked: int = 0,
        anthropic: bool = False,
    ) -> APIError:
        """The refusal of a job over the key's request rate, byte or token budget
        (contract.lua.accounting.ADMIT). The client is to retry when this minute's budgets
        reset. The refusal carries the rate-limit headers. `requests` and `tokens` are the
        counts this minute, None where not known. A refusal over the token budget says what
        the job `asked` for."""
        budgets, minute = self.budgets(grant), this_minute()
        wait = retry_after_s(minute)
        if what == "tokens":
            limit = budgets.tokens_per_minute
            message = (
                f"This API key is over its tokens per minute: the limit is {limit}, {tokens} are "
                f"counted this minute, and this request reserves {asked} (the most its prompt can be, "
                f"a token a byte, and its max_tokens); retry after {wait} seconds."
            )
            if asked > limit:
                message = (
                    f"Request too large for this API key's tokens per minute: the limit is {limit}, "
                    f"this request reserves {asked} (the most its prompt can be, a token a byte, and its "
                    "max_tokens; what it does not use is given back when it ends). Lower max_tokens "
                    "or shorten the prompt."
                )
        else:
            limit_text = (
                f"{budgets.requests_per_minute} requests"
                if what == "requests"
                else f"{budgets.bytes_per_minute} bytes"
            )
            message = f"This API key sent more than {limit_text} per minute; retry after {wait} seconds."
        return APIError(
            errors.RATE_LIMITED,
            message,
            headers={"Retry-After": str(wait)} | headers(budgets, minute, requests, tokens, anthropic),
        )

    def jobs(self, unfinished: int) -> APIError:
        """The refusal of a job over MAX_JOBS_PER_KEY. The limit is checked with the job's
        record, in one atomic step across replicas (contract.lua.accounting.ADMIT)."""
        return self._too_many(
            errors.TOO_MANY_JOBS,
            f"Too many unfinished requests for this API key ({unfinished}; the limit is "
            f"{self._quotas.max_jobs_per_key}).",
        )

    def _too_many(self, error: errors.ErrorCode, message: str) -> APIError:
        return APIError(error, message, headers={"Retry-After": str(self._intake.retry_after_s)})


def not_found(pool: str) -> APIError:
    model, kind = tiers.served_model(pool)
    served = "no worker serves it" if kind == "chat" else f"no worker serves its {kind}"
    return APIError(errors.MODEL_NOT_FOUND, f"The model '{model}' does not exist or {served}.", param="model")
