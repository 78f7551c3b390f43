"""The API endpoints that create jobs, each described once.

A description says where the endpoint lives and what its ids and objects are called. It names
the request body, and how a job's entries become what its clients receive. The file
api/endpoints/routes.py builds every route of an endpoint from its description.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.endpoints.body import Body
from api.endpoints.chat.body import ChatRequest
from api.endpoints.chat.events import chunk_events
from api.endpoints.chat.objects import ChatChunks
from api.endpoints.completions.body import CompletionRequest
from api.endpoints.completions.objects import TextChunks
from api.endpoints.embeddings.body import EmbeddingRequest
from api.endpoints.embeddings.objects import ID_PREFIX as EMBEDDING_PREFIX
from api.endpoints.embeddings.objects import EmbeddingObjects
from api.endpoints.messages.body import MessagesRequest
from api.endpoints.messages.events import message_events
from api.endpoints.messages.objects import ID_PREFIX as MESSAGE_PREFIX
from api.endpoints.messages.objects import MessageObjects
from api.endpoints.protocol import Events, Objects
from api.endpoints.rerank.body import RerankRequest
from api.endpoints.rerank.objects import ID_PREFIX as RERANK_PREFIX
from api.endpoints.rerank.objects import RerankObjects
from api.endpoints.responses.body import ResponsesRequest
from api.endpoints.responses.events import response_events
from api.endpoints.responses.objects import ID_PREFIX, ResponseObjects
from api.jobs.state import JobState

_ALPHABET = string.ascii_letters + string.digits
# also the ids of earlier releases
_ID_REST = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    # recorded in the job hash: a job id is only found through its own endpoint
    name: str
    # POST here creates; {path}/{id} retrieves or resumes, deletes; .../cancel cancels
    path: str
    id_prefix: str
    # what its errors call one ("completion", "response")
    noun: str
    body: type[Body]
    # the class of its objects (`Objects`, with `of(job)`), built from a job's entries
    objects: Any
    # its SSE stream from a raw resume cursor (None: its answers are never streamed)
    events: Callable[[Any, str | None], Events] | None

    @property
    def object(self) -> str:
        return self.objects.object

    def new_id(self) -> str:
        """Unguessable (148 random bits), letters and digits only. RQ job ids allow them, and
        contract.keys.rq_job_id relies on it."""
        return self.id_prefix + "".join(secrets.choice(_ALPHABET) for _ in range(25))

    def owns(self, job_id: str) -> bool:
        """Whether the id could be one of this endpoint's. It is checked before the id is used or
        logged: a path is the client's own text."""
        rest = job_id[len(self.id_prefix) :]
        return job_id.startswith(self.id_prefix) and _ID_REST.fullmatch(rest) is not None

    def objects_of(self, job: JobState) -> Objects:
        return self.objects.of(job)


CHAT = Endpoint(
    name="chat",
    path="/v1/chat/completions",
    id_prefix="chatcmpl-",
    noun="completion",
    body=ChatRequest,
    objects=ChatChunks,
    events=chunk_events,
)
TEXT = Endpoint(
    name="text",
    path="/v1/completions",
    id_prefix="cmpl-",
    noun="completion",
    body=CompletionRequest,
    objects=TextChunks,
    events=chunk_events,
)
RESPONSES = Endpoint(
    name="responses",
    path="/v1/responses",
    id_prefix=ID_PREFIX,
    noun="response",
    body=ResponsesRequest,
    objects=ResponseObjects,
    events=response_events,
)
MESSAGES = Endpoint(
    name="messages",
    path="/v1/messages",
    id_prefix=MESSAGE_PREFIX,
    noun="message",
    body=MessagesRequest,
    objects=MessageObjects,
    events=message_events,
)
EMBEDDINGS = Endpoint(
    name="embeddings",
    path="/v1/embeddings",
    id_prefix=EMBEDDING_PREFIX,
    noun="embedding",
    body=EmbeddingRequest,
    objects=EmbeddingObjects,
    events=None,
)
RERANK = Endpoint(
    name="rerank",
    # also /v2/rerank and /rerank (api/endpoints/rerank/routes.py)
    path="/v1/rerank",
    id_prefix=RERANK_PREFIX,
    noun="rerank",
    body=RerankRequest,
    objects=RerankObjects,
    events=None,
)
ENDPOINTS = (CHAT, TEXT, RESPONSES, MESSAGES)
"""The endpoints whose jobs a client streams, retrieves, resumes and cancels by id."""
BATCHABLE = {s.path: s for s in (CHAT, TEXT, EMBEDDINGS, RERANK)}
"""The endpoints a Batch API line may name, by path."""
BY_NAME = {s.name: s for s in (*ENDPOINTS, EMBEDDINGS, RERANK)}
