"""The API surfaces that create jobs, each described once: where it lives, what its ids and
objects are called, what its request body is, and how a job's entries become what its
clients receive. api/surfaces/routes.py builds every route of a surface from its description.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from api.jobs.state import JobState
from api.surfaces.answer import Answer
from api.surfaces.body import Body
from api.surfaces.chat.body import ChatRequest, CompletionRequest
from api.surfaces.chat.chunks import ChatChunks, TextChunks
from api.surfaces.chat.events import Events, chunk_events
from api.surfaces.embeddings.body import EmbeddingRequest
from api.surfaces.embeddings.objects import ID_PREFIX as EMBEDDING_PREFIX
from api.surfaces.embeddings.objects import EmbeddingObjects
from api.surfaces.messages.body import MessagesRequest
from api.surfaces.messages.events import message_events
from api.surfaces.messages.objects import ID_PREFIX as MESSAGE_PREFIX
from api.surfaces.messages.objects import MessageObjects
from api.surfaces.responses.body import ResponsesRequest
from api.surfaces.responses.events import response_events
from api.surfaces.responses.objects import ID_PREFIX, ResponseObjects

_ALPHABET = string.ascii_letters + string.digits
_ID_REST = re.compile(r"[A-Za-z0-9_-]{1,64}")  # also the ids of earlier releases


class Objects(Protocol):
    """A surface's objects for one job (api/surfaces/chat/chunks.py, api/surfaces/responses/objects.py)."""

    object: str
    id: str

    def answer(self, rows: Any) -> Answer | None: ...
    def pending(self, queued: bool) -> Answer: ...
    def deleted(self) -> dict: ...


@dataclass(frozen=True, kw_only=True)
class Surface:
    name: str  # recorded in the job hash: a job id is only found through its own surface
    path: str  # POST here creates; {path}/{id} retrieves or resumes, deletes; .../cancel cancels
    id_prefix: str
    noun: str  # what its errors call one ("completion", "response")
    body: type[Body]
    objects: Any  # the class of its objects (`Objects`, with `of(job)`), built from a job's entries
    # its SSE stream from a raw resume cursor (None: its answers are never streamed)
    events: Callable[[Any, str | None], Events] | None

    @property
    def object(self) -> str:
        return self.objects.object

    def new_id(self) -> str:
        """Unguessable (148 random bits), letters and digits only (RQ job ids allow them, and
        contract.keys.rq_job_id relies on it)."""
        return self.id_prefix + "".join(secrets.choice(_ALPHABET) for _ in range(25))

    def owns(self, job_id: str) -> bool:
        """Whether the id could be one of this surface's (checked before it is used or
        logged: a path is the client's own text)."""
        rest = job_id[len(self.id_prefix) :]
        return job_id.startswith(self.id_prefix) and _ID_REST.fullmatch(rest) is not None

    def objects_of(self, job: JobState) -> Objects:
        return self.objects.of(job)


CHAT = Surface(
    name="chat",
    path="/v1/chat/completions",
    id_prefix="chatcmpl-",
    noun="completion",
    body=ChatRequest,
    objects=ChatChunks,
    events=chunk_events,
)
TEXT = Surface(
    name="text",
    path="/v1/completions",
    id_prefix="cmpl-",
    noun="completion",
    body=CompletionRequest,
    objects=TextChunks,
    events=chunk_events,
)
RESPONSES = Surface(
    name="responses",
    path="/v1/responses",
    id_prefix=ID_PREFIX,
    noun="response",
    body=ResponsesRequest,
    objects=ResponseObjects,
    events=response_events,
)
MESSAGES = Surface(
    name="messages",
    path="/v1/messages",
    id_prefix=MESSAGE_PREFIX,
    noun="message",
    body=MessagesRequest,
    objects=MessageObjects,
    events=message_events,
)
EMBEDDINGS = Surface(
    name="embeddings",
    path="/v1/embeddings",
    id_prefix=EMBEDDING_PREFIX,
    noun="embedding",
    body=EmbeddingRequest,
    objects=EmbeddingObjects,
    events=None,
)
SURFACES = (CHAT, TEXT, RESPONSES, MESSAGES)
"""The surfaces whose jobs a client streams, retrieves, resumes and cancels by id."""
BATCHABLE = {s.path: s for s in (CHAT, TEXT, EMBEDDINGS)}
"""The endpoints a Batch API line may name, by path."""
BY_NAME = {s.name: s for s in (*SURFACES, EMBEDDINGS)}
