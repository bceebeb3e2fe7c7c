"""Which progress bars finished, however the ranks' writes interleave in one stream.

tqdm draws a bar as '\\r' + state per update: 0/N when it opens, increasing counts, and on close the final
state once more followed by a newline that it writes separately. Several processes (one bar per TP rank
in SGLang up to 0.5.22's loaders, rank 0 only in 0.5.23) write into one stream, so an update may be glued to
another rank's log line and a close's newline may land after another rank's write.

So updates alone cannot say which bar finished: a bar prints N/N twice (its last update, its close) and
two bars at N-1 followed by two N/N updates may be one bar finished and one stuck. The newline can: each
bar that finishes writes exactly one, and nothing else in a server's start-up log writes a newline that
is not the end of its own line. So bars are counted, not followed: an update moves the bar with the
highest count below it (a redraw leaves a bar where it is), which puts as many bars at N/N as there were
N/N updates; a newline that ends an update at N/N closes that bar, and one after any other update or on
an empty line closes a bar at N/N still open (of the kind that drew N/N last); only a 0/N opens a bar.
Every bar that finished wrote N/N before its newline, so every close finds a bar, and a stuck bar never
writes one.

The rule the tracker applies: every bar that started is closed -> `shards-loaded`; else the bars open short
of N/N are named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OTHER = ""  # the kind of bars that are not checkpoint bars (graph capture, other loaders)


@dataclass
class _Chain:
    """One bar's updates, as far as they can be told apart."""

    done: int
    closed: bool = False


@dataclass
class _Family:
    kind: str  # the checkpoint bar's description, or OTHER
    total: int
    chains: list[_Chain] = field(default_factory=list)

    def update(self, done: int) -> _Chain | None:
        """Count an update: a new bar at 0, else the bar with the highest count below it moves up; None when
        no bar is below (a redraw: it moves nothing)."""
        if done == 0 or not self.chains:  # a bar opens (or the log began inside one)
            chain = _Chain(done)
            self.chains.append(chain)
            return chain
        below = [c for c in self.chains if c.done < done and not c.closed]
        if below:
            chain = max(below, key=lambda c: c.done)
            chain.done = done
            return chain
        return None

    def open_at_total(self) -> _Chain | None:
        return next((c for c in self.chains if c.done >= self.total and not c.closed), None)


@dataclass
class CheckpointBars:
    """The checkpoint bars of one stream, anonymous (tqdm's) or with a rank prefix."""

    ranked: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (done, total)
    families: dict[tuple[str, int], _Family] = field(default_factory=dict)
    _last_final: str = ""  # the kind of bar that drew N/N most recently

    def _family(self, kind: str, total: int) -> _Family:
        return self.families.setdefault((kind, total), _Family(kind, total))

    def update(self, done: int, total: int, *, rank: int | None = None, ending: str = "\r", kind: str = "") -> None:
        """A checkpoint bar update; `ending` is what ended its piece: '\\r', '\\n' or '' (cut by a glued line)."""
        if rank is not None:
            self.ranked[rank] = (done, total)
            return
        family = self._family(kind or "checkpoint", total)
        self._count(family, done, ending)

    def _count(self, family: _Family, done: int, ending: str) -> None:
        chain = family.update(done)
        if done >= family.total:
            self._last_final = family.kind
            chain = chain or family.open_at_total()  # a redraw at N/N: its newline closes a bar at N/N
        if ending != "\n":
            return
        if chain is not None and chain.done >= family.total and not chain.closed:
            chain.closed = True
        else:
            self.newline()

    def other(self, done: int, total: int, *, ending: str) -> None:
        """An update of another bar (graph capture, another loader): it may carry a checkpoint bar's newline."""
        self._count(self._family(OTHER, total), done, ending)

    def newline(self) -> None:
        """A newline that ended no line of its own: a bar at N/N closed (the kind that drew N/N last first)."""
        families = sorted(self.families.values(), key=lambda f: (f.kind != self._last_final, f.kind == OTHER))
        for family in families:
            chain = family.open_at_total()
            if chain is not None:
                chain.closed = True
                return

    def _checkpoint(self) -> list[_Family]:
        return [f for f in self.families.values() if f.kind != OTHER]

    @property
    def seen(self) -> int:
        return len(self.ranked) + sum(len(f.chains) for f in self._checkpoint())

    @property
    def complete(self) -> bool:
        """Every checkpoint bar that started has finished (anonymous: closed; prefixed: at N/N)."""
        chains = [c for f in self._checkpoint() for c in f.chains]
        ranked_done = all(done >= total for done, total in self.ranked.values())
        return bool(chains or self.ranked) and ranked_done and all(c.closed for c in chains)

    def short(self) -> list[str]:
        """The bars not finished, e.g. ["63/64"] or ["TP1 0/8"]."""
        out = [f"TP{r} {d}/{t}" for r, (d, t) in sorted(self.ranked.items()) if d < t]
        for family in self._checkpoint():
            for chain in family.chains:
                if not chain.closed:
                    done = min(chain.done, family.total - 1)  # at N/N but never closed: still inside its last shard
                    out.append(f"{done}/{family.total}")
        return out

    def describe(self) -> str:
        """ "2 bars closed at 64/64" or "1 bar closed at 64/64; open: 63/64"."""
        finished = [f"TP{r} {d}/{t}" for r, (d, t) in sorted(self.ranked.items()) if d >= t]
        closed: dict[int, int] = {}
        for family in self._checkpoint():
            for chain in family.chains:
                if chain.closed:
                    closed[family.total] = closed.get(family.total, 0) + 1
        parts = [f"{n} bar{'s' if n > 1 else ''} closed at {t}/{t}" for t, n in sorted(closed.items())]
        parts += finished
        text = ", ".join(parts) or "no bar finished"
        short = self.short()
        return f"{text}; open: {', '.join(short)}" if short else text
