"""
The explorer's abstract model: programs (bounded scenarios), steps, the independence
relation, and the enumeration of one interleaving per equivalence class (Mazurkiewicz
trace), in pure Python: nothing here touches a database.

A *program* names the consumer DAGs, the producer transactions and the scheduler loops.
A *schedule* is a list of step tokens, the replayable form:

- ``Q1:a``            transaction Q1 (producer Q) on dataset a, atomic: register, upsert, stamp, COMMIT
- ``P1.reg:a``        P1 registers an event on a (flush; stock writes its queue row here)
- ``P1.stamp``        the fix's queue upsert and stamp, paused before COMMIT (stock: nothing)
- ``P1.stall``        the clock moves ``stall`` seconds (past commit_latency_seconds)
- ``P1.commit`` / ``P1.rollback``
- ``S.loop``          one scheduler loop of run creation, whole
- ``S.q`` ``S.e`` ``S.c``  the same loop in three parts: up to the event read (the queue is
                      read), up to the queue delete (events read, runs created), the rest (COMMIT)
- ``S.restart``       the scheduler process restarts (a new runner: no memory)
- ``S.blind``         a whole loop in which the net does not look at the event ids (its pacing)
- ``S.fail:N``        a whole loop whose Nth statement raises ``OperationalError`` once:
                      ``retry_db_transaction`` rolls it back and runs it again at once (a deadlock)
- ``D.pause:h`` ``D.unpause:h``  the operator pauses / unpauses the DAGs whose name starts with h
- ``D.full:h`` ``D.free:h``  their latest run set running (max_active_runs holds them) / all runs finished
- ``D.clean:h``       their runs finished and ``airflow db clean --tables dag_run`` (the latest kept)
- ``D.off:h`` ``D.on:h``  their ``is_active`` false / true (the DAG file missing for a parse, then back)
- ``D.unmark``        the net's marks deleted (``log`` rows "dataset-race-fix-followed", as db clean)
- ``clock+N`` ``clock-N``  the clock (Python's and the database's) stepped by N seconds

Independence (two steps of different actors that commute): a stall commutes with every step
that reads no clock (commits, rollbacks and the operator's ``D.`` steps; not a scheduler loop,
or its first part: a loop keeps its clock's reading to bound its next read of each DAG's
events, and a stall moves the clock past ``commit_latency_seconds``), and so does a clock
step, with which it commutes (the moves add up); two COMMITs/ROLLBACKs commute (everything
they make visible was written before). Everything else is dependent, which is conservative: a
``D.`` step changes what producers queue and loops decide. Steps of one actor's list (the
operator's clock steps are in its list) never commute. ``reg`` always comes right before its
``stamp`` in enumerated schedules: the registered event is private to its transaction until
COMMIT for the fix (the replay language still takes them apart).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Txn:
    name: str  # producer letter + index: "Q1"
    dataset: str
    open: bool = False  # stamp and COMMIT as separate steps (else one atomic step)
    stall: bool = False  # a stall between stamp and COMMIT (open only)
    rollback: bool = False

    @property
    def actor(self) -> str:
        return self.name.rstrip("0123456789")

    def tokens(self) -> list[str]:
        if not self.open:
            return [f"{self.name}:{self.dataset}"]
        end = "rollback" if self.rollback else "commit"
        return (
            [f"{self.name}.reg:{self.dataset}", f"{self.name}.stamp"]
            + ([f"{self.name}.stall"] if self.stall else [])
            + [f"{self.name}.{end}"]
        )


@dataclass(frozen=True)
class Program:
    """A bounded scenario: DAGs (name -> schedule over dataset letters), transactions, loops."""

    name: str
    dags: tuple[tuple[str, str], ...]  # ("d", "a"), ("e", "a|b"), ("f", "a&b")
    txns: tuple[Txn, ...]
    loops: tuple[tuple[str, int], ...] = (("S", 2),)  # scheduler name -> loops
    split: bool = False  # loops in three parts
    prefix: tuple[str, ...] = ()  # fixed warm-up steps before the explored ones
    backends: tuple[str, ...] = ("sqlite", "postgres", "mysql")
    note: str = ""
    operator: tuple[str, ...] = ()  # the operator's D./clock steps, in order
    blind: int = 0  # the first loops of each scheduler are S.blind (the net does not look)
    per_loop: int | None = None  # max_dagruns_to_create_per_loop
    tick: float = 0.01  # seconds from one step to the next (runner.TICK)
    budget: int | None = None  # at most this many interleavings (CI's time)
    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()  # actors' explicit step lists (S.restart, P1.commit)
    fail_at: tuple[int, ...] = ()  # "S.fail" in them: one space per statement number N (S.fail:N)
    lookback: int | None = None  # event_lookback_seconds

    def actor_programs(self, fail_at: int | None = None) -> dict[str, list[str]]:
        per_actor: dict[str, list[str]] = {}
        for txn in self.txns:
            per_actor.setdefault(txn.actor, []).extend(self.glue(txn.tokens()))
        for scheduler, count in self.loops:
            parts = ["q", "e", "c"] if self.split else ["loop"]
            per_actor[scheduler] = [f"{scheduler}.{part}" for _ in range(count) for part in parts]
            per_actor[scheduler][: self.blind] = [f"{scheduler}.blind"] * self.blind
        for actor, steps in self.lists:
            per_actor[actor] = [f"{t}:{fail_at}" if t.endswith(".fail") else t for t in steps]
        if self.operator:
            per_actor["D"] = list(self.operator)
        return per_actor

    @staticmethod
    def glue(tokens: list[str]) -> list[str]:
        """``reg`` and ``stamp`` as one enumerated step ("P1.reg:a+P1.stamp")."""
        out: list[str] = []
        for token in tokens:
            if ".stamp" in token and out and ".reg:" in out[-1]:
                out[-1] = out[-1] + "+" + token
            else:
                out.append(token)
        return out

    def describe(self) -> str:
        dags = ",".join(f"{n}={s}" for n, s in self.dags)
        return f"{self.name} [dags {dags}; loops {dict(self.loops)}{'; split' if self.split else ''}]"


# -- steps --------------------------------------------------------------------------------
_TOKEN = re.compile(r"^(?P<who>[A-Z][a-z]*\d*)(?:\.(?P<what>[a-z]+))?(?::(?P<ds>[a-z]|\d+))?$")
_CLOCK_STEP = re.compile(r"^clock(?P<by>[+-]\d+)$")
OPERATOR_KINDS = ("pause", "unpause", "full", "free", "clean", "off", "on")


@dataclass(frozen=True)
class Step:
    actor: str  # producer letter or scheduler name
    txn: str | None  # "P1" for producer steps
    kind: str  # atomic reg stamp stall commit rollback | loop q e c restart blind | D's | clock
    dataset: str | None = None  # D's steps: the DAGs' name (prefix)
    seconds: int = 0  # a clock step's; S.fail's statement number

    def __str__(self) -> str:
        if self.kind == "clock":
            return f"clock{self.seconds:+d}"
        if self.actor == "D":
            return "D.unmark" if self.kind == "unmark" else f"D.{self.kind}:{self.dataset}"
        if self.kind == "fail":
            return f"{self.actor}.fail:{self.seconds}"
        if self.txn is None:
            return f"{self.actor}.{self.kind}"
        if self.kind == "atomic":
            return f"{self.txn}:{self.dataset}"
        return f"{self.txn}.{self.kind}" + (f":{self.dataset}" if self.dataset else "")


def parse_step(token: str) -> Step:
    clock = _CLOCK_STEP.match(token.strip())
    if clock:
        return Step("clock", None, "clock", seconds=int(clock["by"]))
    m = _TOKEN.match(token.strip())
    if not m:
        raise ValueError(f"not a step: {token!r}")
    who, what, ds = m["who"], m["what"], m["ds"]
    if ds and ds.isdigit() and what != "fail":
        raise ValueError(f"only a failing loop takes a number (S.fail:N): {token!r}")
    if who[-1].isdigit():  # a transaction
        actor = who.rstrip("0123456789")
        if what is None:
            if not ds:
                raise ValueError(f"an atomic transaction step needs its dataset: {token!r}")
            return Step(actor, who, "atomic", ds)
        if what not in ("reg", "stamp", "stall", "commit", "rollback"):
            raise ValueError(f"unknown transaction step {token!r}")
        if what == "reg" and not ds:
            raise ValueError(f"reg needs its dataset: {token!r}")
        return Step(actor, who, what, ds)
    if who == "D":
        if what == "unmark" and not ds:
            return Step(who, None, what)
        if what not in OPERATOR_KINDS or not ds:
            raise ValueError(f"an operator step is D.{{{','.join(OPERATOR_KINDS)}}}:<dag>: {token!r}")
        return Step(who, None, what, ds)
    if what == "fail":
        if not ds or not ds.isdigit() or int(ds) < 1:
            raise ValueError(f"a failing loop needs its failing statement's number (S.fail:N): {token!r}")
        return Step(who, None, what, seconds=int(ds))
    if what not in ("loop", "q", "e", "c", "restart", "blind"):
        raise ValueError(f"unknown scheduler step {token!r}")
    return Step(who, None, what)


def parse_schedule(text: str) -> list[Step]:
    return [parse_step(t) for t in tokens(text)]


def tokens(text: str) -> list[str]:
    """The step tokens of a schedule or of one glued step ("P1.reg:a+P1.stamp"; not "clock+5")."""
    return [t for t in re.split(r"\s+|\+(?=[A-Z])", text.strip()) if t]


def format_schedule(steps) -> str:
    return " ".join(str(s) for s in steps)


# -- independence and enumeration ------------------------------------------------------------
_CLOCK_READERS = ("atomic", "reg", "stamp", "loop", "q", "blind", "fail")
_CLOCK_MOVES = {"stall", "clock"}
_ENDS = ("commit", "rollback")


def _kinds(token: str) -> list[Step]:
    return parse_schedule(token)


def independent(x: str, y: str) -> bool:
    xs, ys = _kinds(x), _kinds(y)
    if xs[0].actor == ys[0].actor:
        return False
    kx, ky = {s.kind for s in xs}, {s.kind for s in ys}
    if kx <= _CLOCK_MOVES:
        return not (ky & set(_CLOCK_READERS))
    if ky <= _CLOCK_MOVES:
        return not (kx & set(_CLOCK_READERS))
    return kx <= set(_ENDS) and ky <= set(_ENDS)


@dataclass
class Space:
    """The explored interleavings of a program: one per trace (lexicographically least)."""

    program: Program
    _order: dict[str, int] = field(default_factory=dict)
    fail_at: int | None = None  # of a program with fail_at: this statement number's part of the space

    def __post_init__(self) -> None:
        self.parts = []
        if self.fail_at is None:
            self.parts = [Space(self.program, fail_at=n) for n in self.program.fail_at]
        per_actor = self.parts[0].per_actor if self.parts else self.program.actor_programs(self.fail_at)
        if self.parts:
            self.actors = self.parts[0].actors
            self.per_actor = per_actor
            return
        self.actors = sorted(per_actor)
        self.per_actor = per_actor
        tokens = [t for a in self.actors for t in per_actor[a]]
        self._order = {t: i for i, t in enumerate(tokens)}
        owner = {t: a for a in self.actors for t in per_actor[a]}
        self._indep = {(a, b): owner[a] != owner[b] and independent(a, b) for a in tokens for b in tokens}

    def __iter__(self) -> Iterator[list[str]]:
        if self.parts:
            for part in self.parts:
                yield from part
            return
        word: list[str] = []
        pos = dict.fromkeys(self.actors, 0)
        total = sum(len(v) for v in self.per_actor.values())

        def dfs():
            if len(word) == total:
                yield list(word)
                return
            for actor in self.actors:
                i = pos[actor]
                if i == len(self.per_actor[actor]):
                    continue
                x = self.per_actor[actor][i]
                if not self._normal_after(word, x):
                    continue
                word.append(x)
                pos[actor] += 1
                yield from dfs()
                pos[actor] -= 1
                word.pop()

        yield from dfs()

    def _normal_after(self, word: list[str], x: str) -> bool:
        """
        Appending ``x`` keeps ``word`` the least of its trace (no independent larger step can swap with it).
        """
        kx = self._order[x]
        for y in reversed(word):
            if not self._indep[(x, y)]:
                return True
            if self._order[y] > kx:
                return False
        return True

    def count(self, cap: int = 2_000_000) -> int:
        n = 0
        for _ in self:
            n += 1
            if n >= cap:
                break
        return n

    def choose(self, budget: int, seed: int) -> tuple[int, list[list[str]]]:
        """(size of the space, the interleavings to run): all of them, or ``budget`` drawn with ``seed``."""
        size = self.count()
        if size <= budget:
            chosen = [self.expand(w) for w in self]
            random.Random(seed).shuffle(chosen)
            return size, chosen
        picked = set(random.Random(seed).sample(range(size), budget))
        chosen = [self.expand(w) for i, w in enumerate(self) if i in picked]
        random.Random(seed).shuffle(chosen)
        return size, chosen

    def expand(self, word: list[str]) -> list[str]:
        return list(self.program.prefix) + [t for token in word for t in tokens(token)]
