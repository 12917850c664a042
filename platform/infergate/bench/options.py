"""What ``infergate bench`` is asked to do: which scenarios, which variants of the infergate
scenario, and the settings of the run (``BenchOptions``); ``Say`` takes its progress lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infergate.bench.cost import H200_FP16_16_TOKENS_SEQUENCES_PER_S
from infergate.bench.workload import Profile

ALL_SCENARIOS = (
    "ceiling", "infergate", "stand-in", "lean", "inprocess", "floor", "ensemble", "naive",
    "naive-int8", "grpc", "batch",
)  # fmt: skip
# The scenarios on the whole stack, in the order the gRPC and batch cells (not servers:
# each runs on the first of them that runs, infergate.bench.grpc_cell and batch_cell)
# look for one.
STACK_SCENARIOS = ("lean", "infergate")
# The peers of the embeddings task cell (infergate.bench.peers).
PEER_NAMES = ("fastembed", "infinity")
Say = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """The infergate scenario once more under other settings, measured in the same run:
    how one change is priced side by side (``infergate bench --variant``)."""

    label: str
    env: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``LABEL:NAME=VALUE[,NAME=VALUE...]``, names being environment variables."""
        label, sep, assignments = text.partition(":")
        pairs = [item.partition("=") for item in assignments.split(",") if item]
        if not sep or not label.strip() or not pairs or any(not p[1] or not p[0] for p in pairs):
            raise ValueError(
                f"variant {text!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...], e.g. "
                "'no-coalescing:INFERGATE_FRONTEND__BATCH_MAX_ROWS=1'"
            )
        return cls(label.strip(), {name.strip(): value for name, _, value in pairs})


@dataclass(frozen=True)
class BenchOptions:
    """What ``infergate bench`` was asked to do."""

    profile: Profile
    scenarios: tuple[str, ...] = ALL_SCENARIOS
    cache_dir: Path | None = None
    refresh_model: bool = False
    timeout_s: float = 60.0
    quiet_wait_s: float = 0.0  # per cell, how long to wait for other load to calm down
    noisy_retries: int = 2  # measurements disturbed by other load are repeated this often
    variants: tuple[Variant, ...] = ()
    tasks: tuple[str, ...] = ()  # the task cells to measure (infergate.bench.task_cells)
    peers: tuple[str, ...] = ()  # peers measured in the feature-extraction task cell
    # The GPU the cost table prices front-end cores against (infergate.bench.cost).
    gpu_sequences_per_s: float = H200_FP16_16_TOKENS_SEQUENCES_PER_S
