"""What the HTTP side hands the scheduler and what it gets back: a Request, its events (Delta, then one Finish or
Failure), the refusals at submission (QueueFull, ShuttingDown), and the scheduler's record of a step in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from fdpp_rewrite.serve.text import TextStream


class QueueFull(Exception):
    """The waiting queue holds --max-queue requests already."""


class ShuttingDown(Exception):
    """drain() was called: no request is admitted any more."""


@dataclass
class Delta:
    text: str


@dataclass
class Finish:
    reason: str             # "stop" (EOS or a stop string) or "length" (max_tokens)
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Failure:
    kind: str               # "timeout", "engine" or "shutdown"
    message: str


@dataclass
class Request:
    prompt: list
    max_tokens: int
    sampler: object         # fdpp_rewrite.engine.runtime.Sampler
    emit: Callable
    stop: list = field(default_factory=list)
    timeout_s: float = 600.0
    # the scheduler's state
    submitted: float = 0.0
    arrival: int = 0        # the order of submission (oldest first; the youngest is preempted first)
    deadline: float = 0.0
    slot: int | None = None
    prefilled: int = 0      # tokens of `context` already in the slot
    context: list | None = None  # the ids to prefill: the prompt, or after a preemption prompt + tokens (paged)
    tokens: list = field(default_factory=list)  # the generated ids (EOS excluded)
    next_token: int | None = None
    last_token_at: float = 0.0
    cancelled: bool = False
    done: bool = False      # its slot is freed: tokens of steps still in flight for it are dropped
    text: TextStream | None = None


@dataclass
class InFlight:
    """A step launched on the GPU whose tokens the host has not read yet."""
    batch: list             # the decode rows' requests, in order
    sampled: object         # [len(batch) + len(firsts)] device tokens: the decode rows', then the firsts'
    host: object            # their copy on the host, valid once `event` has completed
    event: object           # None on the cpu backend (host is sampled itself)
    firsts: list = field(default_factory=list)  # requests whose prompt's last chunk ran in this step
    kind: str = "decode"    # or "mixed": a prompt chunk rode on it
    queued: bool = False    # launched while the step before it was still in flight (back to back on the GPU)

    @property
    def rows(self) -> list:
        """The requests of the sampled tokens, in order."""
        return self.batch + self.firsts
