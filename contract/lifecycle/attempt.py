"""The states of an attempt, and every move between them, as data. `after` is the rule the worker's
`Attempt` (worker/attempts/attempt.py) moves by.

An attempt is one worker's try at a job, from its claim at epoch n to its end. Most states are seen
in Redis too. `yielding` lives in the worker's memory only, and `dead` in the reaper's view only. A
move from a state in its `keeps` is made but leaves the state as it was. `keeps` is there because a
fence, a cancel or a preemption may come from another thread at any time.
"""

from __future__ import annotations

from contract.lifecycle.states import API, REAPER, TAKEN_BACK, WORKER, Move, State

CLAIMED = State(
    "claimed",
    "CLAIM gave it the job's next epoch, fencing out every earlier attempt: it reads back their entries.",
    ("job", "alive", "running"),
    outcome="started",
)
GENERATING = State(
    "running",
    "Its Started entry is written: it generates, APPENDs its entries and BEATs until its end.",
    ("events", "alive"),
)
PROVING = State(
    "proving",
    "It runs a suspect beside its worker's other suspects, until SUSPECT_TOKENS past where it died.",
    ("job",),
)
STOPPING = State(
    "stopping",
    "A cancel is due: it writes Finished(cancelled) at its next token.",
    ("job",),
)
YIELDING = State(
    "yielding",
    "Its worker asked it to give its job back at its next token, to make room (a preempted batch line).",
)
FENCED = State("fenced", "A later epoch or an end took its job: its writes are refused.", outcome="fenced")
HANDED_OFF = State(
    "handed-off",
    "It gave its job back as a continuation: its worker shuts down, or a batch line is preempted.",
    outcome="handed-off",
)
DEAD = State("dead", "Its heartbeat expired or its worker's connections closed.", ("alive",))
ENDED = State("ended", "It wrote its job's terminal entry.", ("events",), ended=True)

ATTEMPT_STATES = (CLAIMED, GENERATING, PROVING, STOPPING, YIELDING, FENCED, HANDED_OFF, DEAD, ENDED)
LIVE = ("claimed", "running", "proving", "stopping", "yielding")
# what the worker did last: a fence may still come
GONE = ("ended", "handed-off")

ATTEMPT_MOVES = (
    Move(
        "claim",
        (),
        ("claimed",),
        WORKER,
        ("attempts.CLAIM",),
        ("job", "alive", "running", "pending"),
        "Bump the epoch, count the attempt, mark the job running. A retried claim gets the same one.",
    ),
    Move(
        "start",
        ("claimed",),
        ("running", "proving"),
        WORKER,
        ("attempts.APPEND",),
        ("events", "job"),
        "Once a replica holds the claim, write the Started entry (a suspect's attempt then proves).",
        keeps=("stopping", "yielding", "fenced"),
    ),
    Move(
        "cancel",
        ("claimed", "running", "proving", "yielding"),
        ("stopping",),
        API,
        ("attempts.CLAIM", "attempts.APPEND"),
        ("job",),
        "The API sets `cancel_at` (api/jobs/store.py): CLAIM's or APPEND's reply tells the attempt.",
        keeps=("stopping", *GONE, "fenced"),
    ),
    Move(
        "preempt",
        ("claimed", "running"),
        ("yielding",),
        WORKER,
        (),
        (),
        "Its worker picks a batch line to give its job back, for an interactive job (never a suspect).",
        keeps=("stopping", "yielding", *GONE, "fenced"),
    ),
    Move(
        "beat",
        LIVE,
        ("fenced",),
        WORKER,
        ("attempts.BEAT",),
        ("alive",),
        "Keep the attempt alive while its epoch is current: a 0 says it was fenced out.",
        stays=True,
    ),
    Move(
        "clear",
        ("proving",),
        ("running",),
        WORKER,
        ("attempts.CLEAR_SUSPECT",),
        ("job",),
        "A suspect gone SUSPECT_TOKENS on is nobody's suspect: its charges, stalls and group go.",
        keeps=("stopping", "fenced"),
    ),
    Move(
        "end",
        ("claimed", "running", "proving", "stopping", "yielding"),
        ("ended",),
        WORKER,
        ("attempts.APPEND", "attempts.FAIL"),
        ("events", "job", "running", "alive"),
        "Write the terminal entry: stop, length, tool calls, cancelled, or a failure.",
        keeps=("fenced",),
    ),
    Move(
        "fence",
        (*LIVE, *GONE),
        ("fenced",),
        WORKER,
        ("attempts.APPEND", "attempts.BEAT"),
        (),
        "Its write or beat is refused: a CLAIM, an ABANDON or an END (its own too) moved the job on.",
        keeps=("fenced",),
    ),
    Move(
        "hand off",
        LIVE,
        ("handed-off",),
        WORKER,
        ("jobs.ABANDON",),
        TAKEN_BACK,
        "Write what it generated, then give the job back (shutdown, preemption, a rollback).",
        "queueing.abandon",
        keeps=(*GONE, "fenced"),
    ),
    Move(
        "die",
        LIVE,
        ("dead",),
        REAPER,
        ("jobs.INDEXES",),
        (),
        "The reaper finds its alive key expired, or its worker's named connections gone.",
    ),
    Move(
        "reap",
        ("dead",),
        ("fenced",),
        REAPER,
        ("jobs.ABANDON",),
        TAKEN_BACK,
        "The reaper moves the epoch on and requeues the job. A frozen worker learns it at its next write.",
        "queueing.abandon",
    ),
)
MOVES = {m.name: m for m in ATTEMPT_MOVES}


class IllegalMove(Exception):
    """A move the attempt's state does not allow. It is a bug in the worker, not a Redis answer."""


def after(state: str, name: str, to: str = "") -> str:
    """The state an attempt in `state` is in after the move `name`. `to` names the target of a move
    with more than one. Raises IllegalMove if it may not make the move from there."""
    move = MOVES.get(name)
    if move is None:
        raise IllegalMove(f"no move {name!r}")
    if state in move.keeps:
        return state
    if state not in move.sources and (state or move.sources):
        raise IllegalMove(f"{name} from {state!r}: only from {', '.join(move.sources) or '(new)'}")
    target = to or (move.targets[0] if len(move.targets) == 1 else "")
    if target not in move.targets:
        raise IllegalMove(f"{name} to {target!r}: only to {', '.join(move.targets)}")
    return target
