"""What ran where: the partition of each captured graph and what became of each subgraph."""

from __future__ import annotations

import logging
import sys
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger("gensorage.torch")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message (dynamo's messages run to pages)."""
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


#: How dynamo joins a graph break to the one it hit while handling it (in a loop, say).
_CHAINED = "*** While handling this graph break, another graph break occurred: ***"


def dynamo_reason(why: str) -> str:
    """One line for a dynamo graph break reason: each break's title and explanation (its hints, debug context
    and links dropped), a chained break after the first's."""
    parts = []
    for part in why.split(_CHAINED):
        lines = [ln.strip() for ln in part.splitlines() if ln.strip()]
        detail = lines[1].removeprefix("Explanation: ") if len(lines) > 1 else ""
        parts.append(": ".join(filter(None, (lines[0] if lines else "", detail))))
    return "; then ".join([p.rstrip(".") for p in parts[:-1]] + parts[-1:])


@dataclass(slots=True)
class Report:
    """Lines for people, added as graphs are partitioned and subgraphs compiled (``print`` when ``echo``)."""

    echo: bool = False
    lines: list[str] = field(default_factory=list)
    graphs: int = 0

    def add(self, line: str) -> None:
        self.lines.append(line)
        log.info(line)
        if self.echo:
            print(f"gensorage: {line}", file=sys.stderr)

    def graph(self, nodes: int, in_gensorage: int, torch_reasons: dict[str, str]) -> None:
        """One captured graph: how many of its ``nodes`` ops went to gensorage, and why the others did not."""
        self.graphs += 1
        self.add(f"graph {self.graphs}: {in_gensorage} of {nodes} ops in gensorage subgraphs")
        for why, count in Counter(torch_reasons.values()).most_common():
            names = [n for n, r in torch_reasons.items() if r == why]
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            self.add(f"  torch ({count}): {why}  [{shown}]")

    def graph_breaks(self, reasons: list[str]) -> None:
        """Where dynamo split the model (a data-dependent shape, say): the code between graphs runs in torch."""
        for why in reasons:
            self.add(f"graph break, runs in torch: {dynamo_reason(why)}")

    def not_captured(self, reasons: list[str]) -> None:
        """What dynamo could not capture at all (a graph break inside a loop skips the whole function): that code
        runs in torch, with no graph to partition."""
        said = [dynamo_reason(why) for why in reasons]
        # a break dynamo hit while handling another is recorded alone too: said once, in the chain
        for line in dict.fromkeys(
            s for s in said if not any(t.startswith(f"{s.rstrip('.')}; ") for t in said)
        ):
            self.add(f"not captured, runs in torch: {line}")

    def subgraph(self, name: str, what: str) -> None:
        self.add(f"{name}: {what}")

    def text(self) -> str:
        return "\n".join(self.lines)


__all__ = ["Report", "dynamo_reason", "first_line"]
