"""The words tokenspool coins or uses in a sense of its own. Each has one sentence, and the file
that says more. The file docs/glossary.md is generated from them. A test checks that each word is
still used in the code and that each file named exists."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Word:
    word: str
    # one sentence
    meaning: str
    # the file that says more
    see: str


WORDS = (
    Word(
        "attempt",
        "One worker's try at a job, from its claim to its end: a job may take several.",
        "worker/attempts/attempt.py",
    ),
    Word(
        "epoch",
        "The job's fencing token: each claim, requeue and end bumps it, and only the attempt "
        "holding the current one may write.",
        "contract/lua/attempts.py",
    ),
    Word(
        "claim",
        "The step that starts an attempt at the job's next epoch (CLAIM), fencing out every earlier one.",
        "contract/lua/attempts.py",
    ),
    Word(
        "claim token",
        "A random token an attempt claims with, so that a retried CLAIM or APPEND whose reply was "
        "lost is known as its own.",
        "contract/lua/attempts.py",
    ),
    Word(
        "fenced",
        "Said of an attempt whose epoch is no longer the job's: its writes are refused with FENCED.",
        "contract/lua/attempts.py",
    ),
    Word(
        "continuation",
        "A job requeued after an attempt, whose next attempt appends the token ids already "
        "published and goes on.",
        "worker/attempts/rules.py",
    ),
    Word(
        "hand off",
        "To give a running job back as a continuation, uncharged: at shutdown, on a preemption or "
        "a rollback.",
        "worker/attempts/rules.py",
    ),
    Word(
        "preempt",
        "To make a batch line give its job back at its next token, so that a waiting interactive "
        "job takes its slot.",
        "worker/intake/lending.py",
    ),
    Word(
        "lend",
        "To let Batch API lines use the slots kept for interactive jobs while none has come for a while.",
        "worker/intake/lending.py",
    ),
    Word(
        "callback",
        "The short claim (SET NX) one worker wins on a waiting interactive job before it preempts "
        "a batch line for it.",
        "worker/intake/lending.py",
    ),
    Word(
        "reaper",
        "The task, in one API process at a time, that finds dead attempts and requeues or fails their jobs.",
        "api/cluster/reaper.py",
    ),
    Word(
        "dead",
        "Said of an attempt whose heartbeat key expired or whose worker's named connections are gone.",
        "api/cluster/reaper.py",
    ),
    Word(
        "stall",
        "A death at which a job stood still, having written fewer than 1 + SUSPECT_TOKENS entries "
        "in that attempt.",
        "contract/lua/jobs.py",
    ),
    Word(
        "charge",
        "A death counted against the job itself, toward MAX_ATTEMPTS, when it stood still alone "
        "or as the suspect.",
        "api/cluster/reaper.py",
    ),
    Word(
        "suspect",
        "A job that stood still at two deaths in a row (one alone), run only beside a worker's "
        "other suspects until cleared.",
        "api/cluster/reaper.py",
    ),
    Word(
        "group",
        "The most suspects a suspect may step with, halved at each death among them (0: any).",
        "contract/lua/jobs.py",
    ),
    Word(
        "proof",
        "A group of suspects stepping together apart from the jobs reading, to show which of them "
        "kills workers.",
        "worker/attempts/proofs.py",
    ),
    Word(
        "clear",
        "To drop a suspect's mark, charges and stalls once it has gone SUSPECT_TOKENS past where it died.",
        "contract/lua/attempts.py",
    ),
    Word(
        "bystander",
        "A job that died only because it shared a batch with the one that killed the worker.",
        "api/cluster/reaper.py",
    ),
    Word(
        "owner",
        "The hash of the API key that made a job or a file: limits, budgets and caches are "
        "counted per owner.",
        "contract/keys.py",
    ),
    Word(
        "held",
        "What an owner has open against its limits (jobs, files, bytes), or the prompt prefixes a "
        "worker's slots hold.",
        "contract/keys.py",
    ),
    Word(
        "settle",
        "To make a count final once known: SETTLE turns a job's reserved tokens into those it "
        "used, and an attempt settles its claim once a replica holds it.",
        "contract/lua/accounting.py",
    ),
    Word(
        "reservation",
        "The tokens ADMIT counts against an owner for a new job (its prompt's bound and "
        "max_tokens) until it settles.",
        "contract/lua/accounting.py",
    ),
    Word(
        "ticket",
        "One admitted stream's place among its key's open streams, given back when the response ends.",
        "api/jobs/admission.py",
    ),
    Word(
        "tier",
        "A job's queue class (priority, default, flex, batch): a worker takes them in that order.",
        "contract/tiers.py",
    ),
    Word(
        "routed",
        "Said of a new job put on the queue of the worker whose cache holds its prompt's prefix, "
        "until a deadline.",
        "api/jobs/routing.py",
    ),
    Word(
        "inbox",
        "A worker's hash of the job ids it took from its queues and has not yet claimed, put back "
        "if it dies.",
        "contract/keys.py",
    ),
    Word(
        "pending",
        "Said of a job recorded but not yet on a queue, which the reaper enqueues if its enqueuer died.",
        "contract/queueing.py",
    ),
    Word("wake", "A list of tokens, one per enqueued job, that idle workers block on.", "contract/keys.py"),
    Word(
        "shard",
        "One of 32 slices of the streams server's keys, fixed by the job id's CRC-32, sharing one hash tag.",
        "contract/keys.py",
    ),
    Word(
        "slot",
        "One sequence of a worker's shared llama.cpp batch: a worker runs up to SLOTS jobs at once.",
        "worker/engine/batching.py",
    ),
    Word(
        "pool",
        "The workers serving one model (or its embeddings, or its reranking), with queues of their own.",
        "contract/tiers.py",
    ),
    Word(
        "announcement",
        "A worker's periodic note of its model, slots, load and held prefixes, without which it "
        "is forgotten.",
        "worker/intake/presence.py",
    ),
    Word(
        "entry",
        "One item of a job's stream: started, delta, finished or failed, each stamped with its "
        "attempt's epoch.",
        "contract/entries.py",
    ),
    Word(
        "retention",
        "How long an ended job's hash and stream stay for resumes and fetches (RETENTION_SECONDS).",
        "contract/settings.py",
    ),
    Word(
        "surface",
        "The endpoint that created a job (chat, text, responses, ...), which decides how its "
        "entries are answered.",
        "contract/keys.py",
    ),
    Word(
        "spec",
        "The job description (JobSpec) the API records and enqueues: a worker runs only the spec recorded.",
        "contract/jobspec.py",
    ),
    Word(
        "digest",
        "The hash of a job's spec, recorded with it: CLAIM runs no other spec.",
        "contract/jobspec.py",
    ),
    Word(
        "seal",
        "To encrypt a Responses reasoning item for a client that keeps no state (store: false).",
        "api/endpoints/responses/sealing.py",
    ),
    Word(
        "ack mark",
        "A counter the API increments before a WAIT, so that a replica holding it is known to "
        "hold every write before it.",
        "api/jobs/acks.py",
    ),
    Word(
        "move",
        "A named step of a job or an attempt from one state to another (claim, fence, hand off), "
        "with the side that makes it and its Lua scripts.",
        "contract/lifecycle/attempt.py",
    ),
    Word(
        "sweep",
        "What the reaper reads of every shard each tick, in one go: the running attempts and "
        "the jobs pending past their grace.",
        "api/jobs/state.py",
    ),
)
