"""The race that goes on while the model serves: who should serve a graph, from paired calls.

Selection times candidates once, on whatever the machine was doing then. At run time the
server (the backend answering the calls) and each challenger run the same call's inputs on
sampled calls, the server first (in the stream of its served calls, as it serves), then the
challenger: a pair of times. Per challenger, a one-sided sign test decides:

- **faster**: in its last `WINDOW` pairs it beat the server by more than `MARGIN` so often
  that chance explains it with probability under `ALPHA`, and the median ratio agrees: it
  is promoted (the old server becomes a challenger);
- **not faster**: in its last `RETIRE_WINDOW` pairs it failed to beat the server by
  `MARGIN` so often: it retires (a twin of the server takes tens of pairs to tell).

A verdict counts only when it repeats `CONFIRM` pairs in a row (hysteresis), and a graph
switches servers at most `MAX_SWITCHES` times (no flapping). Each pair says whether the
machine was busy when it was taken (`busy_now`); where the window holds `MIN_PAIRS` quiet
pairs the verdict uses only those, else it is a verdict on noisy evidence: acted on, but
provisional. The race ends once every challenger retired on quiet evidence; while a
provisional verdict stands it goes on at `PROVISIONAL_RATE`. Every other pair goes to the
challenger leading so far (the others in turn), so a clear winner is found sooner. Its cost
is bounded: a pair is due only while the race's extra time (the challenger's call, its
copies, the comparison) stays under `RATE` (2%) of the serving time (calls times the
server's median call).

Pure logic on numbers: tests feed it recorded or synthetic times (tests/test_race.py).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

MARGIN = 0.03  # a challenger must beat the server by more than 3% to be promoted
ALPHA = 0.01  # the sign test's level, both ways
WINDOW = 12  # the pairs a promotion is judged on: the most recent (the load drifts)
MIN_PAIRS = 8  # fewer pairs promote nothing
RETIRE_WINDOW = 64  # the pairs a retirement is judged on (a twin of the server needs many)
MIN_RETIRE = 32  # fewer pairs retire nothing
CONFIRM = 3  # the same verdict at this many pairs in a row before it is acted on
MAX_SWITCHES = 4  # server changes per graph; then the race ends where it stands
RATE = 0.02  # the race's extra time, at most this share of the serving time
PROVISIONAL_RATE = 0.01  # after a verdict on noisy evidence: on, at half the rate
FIRST_PAIR = 20  # the call of the first pair (the first calls warm caches up)
NOISY_SPREAD = 0.25  # half the ratios' interquartile range over their median, above: noisy

FASTER = "faster"
NOT_FASTER = "not faster"
PROMOTED = "promoted"


class Pair(NamedTuple):
    """One sampled call: the server's and the challenger's seconds on the same inputs."""

    server_s: float
    challenger_s: float
    busy: bool  # the machine was busy when it was taken


@dataclass(frozen=True)
class Verdict:
    """A sign test's outcome over one challenger's window."""

    kind: str  # FASTER or NOT_FASTER
    ratio: float  # median challenger/server time (below 1: the challenger is faster)
    pairs: int
    wins: int  # pairs the challenger won by more than MARGIN
    p: float
    noisy: bool  # decided on busy or widely spread pairs

    def __str__(self) -> str:
        evidence = "noisy evidence" if self.noisy else "quiet evidence"
        return (
            f"{self.kind}: {1 / self.ratio:.2f}x the server, ahead by >{MARGIN:.0%} in "
            f"{self.wins} of {self.pairs} paired calls (sign test p={self.p:.1e}, {evidence})"
        )


def judge(pairs: list[Pair]) -> Verdict | None:
    """The verdict of a challenger's pairs, oldest first (None: not decided): faster on the
    last `WINDOW`, not faster on the last `RETIRE_WINDOW`."""
    faster = _test(pairs[-WINDOW:], MIN_PAIRS, FASTER)
    return faster or _test(pairs[-RETIRE_WINDOW:], MIN_RETIRE, NOT_FASTER)


def _test(pairs: list[Pair], least: int, kind: str) -> Verdict | None:
    """The sign test for `kind` on the quiet pairs alone where there are `least` of them,
    else on all, as noisy evidence."""
    quiet = [p for p in pairs if not p.busy]
    used, noisy = (quiet, False) if len(quiet) >= least else (pairs, True)
    n = len(used)
    if n < least:
        return None
    ratios = sorted(p.challenger_s / max(p.server_s, 1e-12) for p in used)
    ratio = statistics.median(ratios)
    q1, q3 = ratios[n // 4], ratios[(3 * n) // 4]
    noisy = noisy or (q3 - q1) / 2 > NOISY_SPREAD * ratio
    wins = sum(r < 1 - MARGIN for r in ratios)
    if kind == FASTER:
        p = _tail(wins, n)
        return Verdict(kind, ratio, n, wins, p, noisy) if p < ALPHA and ratio < 1 - MARGIN else None
    p = _tail(n - wins, n)
    return Verdict(kind, ratio, n, wins, p, noisy) if p < ALPHA and ratio >= 1 - MARGIN else None


def _tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def busy_now() -> bool:
    """Whether the machine is busy now: more runnable tasks than CPUs (Linux's instant count
    in /proc/loadavg, the calling thread among them), else the 1-minute load average."""
    cpus = os.cpu_count() or 1
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] > cpus
    return running > cpus


@dataclass(frozen=True)
class RaceEvent:
    """A change of who serves or races: at call `call`, `what` ("promoted", "retired",
    "dropped", "ended") happened to `backend`, because `why`."""

    call: int
    what: str
    backend: str
    why: str

    def __str__(self) -> str:
        return f"call {self.call}: {self.backend} {self.what} ({self.why})"


@dataclass
class RaceStats:
    """The race as the report shows it (live: the guard updates it as the graph runs)."""

    server: str
    challengers: list[str]
    state: str = "racing"  # racing / provisional / decided / ended
    pairs: int = 0
    race_s: float = 0.0  # the race's extra time so far
    served_s: float = 0.0  # the serving time it was paid for (calls x the server's median)
    evidence: dict[str, str] = field(default_factory=dict)  # challenger: its window now
    events: list[RaceEvent] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RaceStats | None:
        """The race `to_dict` wrote (None when absent); TypeError on a wrong type."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise TypeError(f"race should be an object or null, got {type(data).__name__}")
        return cls(
            server=str(data.get("server", "")),
            challengers=[str(x) for x in data.get("challengers", [])],
            state=str(data.get("state", "racing")),
            pairs=int(data.get("pairs", 0)),
            race_s=float(data.get("race_s", 0.0)),
            served_s=float(data.get("served_s", 0.0)),
            evidence={str(k): str(v) for k, v in dict(data.get("evidence", {})).items()},
            events=[RaceEvent(**e) for e in data.get("events", [])],
        )

    def __str__(self) -> str:
        share = self.race_s / self.served_s if self.served_s else 0.0
        text = (
            f"race ({self.state}): {self.server} serves; challengers "
            f"{', '.join(self.challengers) or 'none'}; {self.pairs} paired calls, "
            f"cost {share:.1%} of serving time"
        )
        return text + "".join(f"; {e}" for e in self.events)


class Race:
    """One graph's race: which challenger runs next, when, and what each pair decides.
    Thread-safe: `pair` and `due` may be called from any serving thread."""

    def __init__(self, server: str, challengers: list[str], provisional: bool = False) -> None:
        self.stats = RaceStats(server, list(challengers))
        self.windows: dict[str, deque[Pair]] = {c: deque(maxlen=RETIRE_WINDOW) for c in challengers}
        self.streaks: dict[str, tuple[str, int]] = {}
        self.quiet_retired: set[str] = set()
        self.switches = 0
        # a verdict of this race on noisy evidence stands: the lower rate. A selection's
        # noisy decision is not one of them: its race runs at the full rate until a verdict
        self.provisional = False
        if provisional:
            self.stats.state = "provisional"
        self.calls = 0  # calls counted by `due`
        self._counted = 0  # calls whose serving time is in stats.served_s
        self.next_due = FIRST_PAIR
        self.server_s: float | None = None  # the server's median call, from the pairs
        self._turn = 0
        self._lock = threading.Lock()
        if not challengers:
            self.stats.state = "ended"

    @property
    def over(self) -> bool:
        """No pair is due ever again."""
        return self.stats.state in ("decided", "ended")

    def due(self) -> str | None:
        """Count a call; the challenger to race on it, or None (most calls)."""
        self.calls += 1
        if self.calls < self.next_due or self.over:
            return None
        with self._lock:
            live = [c for c in self.stats.challengers if c not in self.quiet_retired]
            if not live or self.calls < self.next_due:
                return None
            self.next_due = self.calls + (1 << 30)  # taken: its pair sets the next one
            self._turn += 1
            if self._turn % 2 and len(live) > 1:  # every other pair: the one leading so far
                return min(live, key=self._median_ratio)
            return live[(self._turn // 2) % len(live)]

    def _median_ratio(self, challenger: str) -> float:
        """The challenger's median time over the server's in its window (1: no pairs yet)."""
        window = self.windows.get(challenger)
        if not window:
            return 1.0
        return statistics.median(p.challenger_s / max(p.server_s, 1e-12) for p in window)

    def add(self, challenger: str) -> None:
        """A challenger joins (compiled after the first call); a decided race reopens."""
        with self._lock:
            stats = self.stats
            if challenger in stats.challengers or challenger == stats.server:
                return
            stats.challengers.append(challenger)
            self.windows[challenger] = deque(maxlen=RETIRE_WINDOW)
            if self.switches < MAX_SWITCHES:
                stats.state = "provisional" if self.provisional else "racing"
            self.next_due = min(self.next_due, self.calls + 1)

    def pair(self, call: int, challenger: str, pair: Pair, cost_s: float) -> RaceEvent | None:
        """Record `pair` (the race's extra time for it: `cost_s`); the event it causes."""
        with self._lock:
            stats = self.stats
            server_s = self.server_s if self.server_s is not None else pair.server_s
            stats.served_s += (self.calls - self._counted) * server_s  # paid since the last
            self._counted = self.calls
            stats.pairs += 1
            stats.race_s += cost_s
            window = self.windows.setdefault(challenger, deque(maxlen=RETIRE_WINDOW))
            window.append(pair)
            servers = [p.server_s for w in self.windows.values() for p in w]
            self.server_s = statistics.median(servers)
            event = self._decide(call, challenger, judge(list(window)))
            if event is not None and event.what == PROMOTED:
                self.server_s = pair.challenger_s  # the new server's call, until pairs say
            rate = PROVISIONAL_RATE if self.provisional else RATE
            # the next pair once the serving time has paid for what the race cost so far
            owed = stats.race_s - rate * stats.served_s
            wait = math.ceil(owed / (rate * self.server_s)) if owed > 0 and self.server_s else 0
            self.next_due = self.calls + 1 + wait
            return event

    def drop(self, call: int, challenger: str, why: str) -> RaceEvent:
        """A challenger that failed (raised, answered wrong) leaves the race."""
        with self._lock:
            return self._leave(call, challenger, "dropped", why)

    def _decide(self, call: int, challenger: str, verdict: Verdict | None) -> RaceEvent | None:
        """Act on `verdict` once it repeated CONFIRM pairs in a row."""
        stats = self.stats
        if verdict is None:
            self.streaks.pop(challenger, None)
            return None
        stats.evidence[challenger] = str(verdict)
        kind, count = self.streaks.get(challenger, ("", 0))
        count = count + 1 if kind == verdict.kind else 1
        self.streaks[challenger] = (verdict.kind, count)
        if count < CONFIRM:
            return None
        if verdict.kind == NOT_FASTER:
            if verdict.noisy:
                self.provisional = True  # judged under load: revisited at the lower rate
                stats.state = "provisional"
                return None
            self.quiet_retired.add(challenger)
            event = RaceEvent(call, "retired", challenger, str(verdict))
            stats.events.append(event)
            self._settle()
            return event
        old = stats.server
        self.switches += 1
        stats.server = challenger
        stats.challengers = [old if c == challenger else c for c in stats.challengers]
        self.windows = {c: deque(maxlen=RETIRE_WINDOW) for c in stats.challengers}  # new server
        self.streaks.clear()
        self.quiet_retired.clear()
        stats.evidence.clear()  # against the old server: read anew against the new one
        self.provisional = verdict.noisy
        stats.state = "provisional" if verdict.noisy else "racing"
        event = RaceEvent(call, PROMOTED, challenger, f"over {old}: {verdict}")
        stats.events.append(event)
        if self.switches >= MAX_SWITCHES:
            stats.events.append(
                RaceEvent(call, "ended", challenger, f"{MAX_SWITCHES} switches: kept serving")
            )
            stats.state = "ended"
        return event

    def _leave(self, call: int, challenger: str, what: str, why: str) -> RaceEvent:
        self.stats.challengers = [c for c in self.stats.challengers if c != challenger]
        self.windows.pop(challenger, None)
        event = RaceEvent(call, what, challenger, why)
        self.stats.events.append(event)
        self._settle()
        return event

    def _settle(self) -> None:
        """Decided once every challenger retired on quiet evidence (none left: ended)."""
        live = [c for c in self.stats.challengers if c not in self.quiet_retired]
        if not self.stats.challengers:
            self.stats.state = "ended"
        elif not live:
            self.stats.state = "decided"
