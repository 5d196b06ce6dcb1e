"""The bounds on what the command accepts, so that any input ends in a plan or a clear error in bounded time.

Each limit is checked where the input is read, before any work, and a value beyond it is a one-line error
naming the option or column and the limit. `measure` and `report` also estimate the memory they would
allocate (`cost_memory_bytes`) and refuse before allocating when the machine has less available.
"""
from __future__ import annotations

from collections.abc import Sequence

from dreamshard.errors import DreamShardError

MAX_DIM = 2**16  # columns of one table: FBGEMM's kernels take far fewer, and column cuts scale with dim / 4
MAX_ROWS = 2**40  # rows of one table: rows x dim x bytes per cell stays inside int64, beyond any cluster's memory
MAX_DEVICES = 2**17  # devices of one plan: per-device loops scale with it
MAX_POOLING_FACTOR = 2**20  # mean lookups per sample of one table: sequence features have thousands, not millions
MAX_BATCH_SIZE = 2**24  # samples per device: far above any training batch; keeps buffer bytes inside int64
MAX_SAMPLES = 10_000  # --samples: each decodes a whole plan with the policy network; more hardly changes the best
# the scale `plan` is built and tested for (benchmarks/planning_scale.py, docs/cli.md): a million tables on a thousand
# devices plan in under a minute; beyond, a one-line error before any work
MAX_TABLES = 2**20  # tables of one tables file
MAX_TABLE_DEVICES = 2**30  # tables x devices: each table's placement looks at every device
MAX_PIECES = 2**21  # tables and pieces of cut tables together (row-wise cuts make a piece per device)
# --samples x tables: each sample places every table with the policy network (about a minute at this count: issue 53)
MAX_SAMPLED_TABLES = 100_000

MAX_TIME_LIMIT = 86_400.0  # --time-limit, seconds: a day
# the searches that rate many whole plans grow faster than the tables: (most tables, most tables x devices), set
# between the sizes each finished within minutes and those that ran past its time limit in results/planning-scale
# (torchrec_full grows with the devices too, torchrec with the tables alone); past them `plan` asks for
# --time-limit instead of running on
SEARCH_SCALE = {"torchrec_full": (300, 100 * 128), "torchrec_model": (3_000, 200 * 128),
                "torchrec": (30_000, 2**30)}

# bytes dreamshard_cut holds per piece it may place (each table whole and at each cut; a row-wise cut is a block per
# device): the features, encodings and the policy's inputs of every piece, sized from its peak memory on 10,000
# tables x 128 devices (issue 53's closing note); it refuses, before building them, what the machine cannot hold
BYTES_PER_CUT_PIECE = 8 * 1024

# bytes the cost model allocates per device (the all-to-all model's float64 arrays, a few at once: linear in the
# devices, hardware/comm.py), per (table, device) pair, and per looked-up id (int64 indices and offsets)
BYTES_PER_DEVICE = 128
BYTES_PER_TABLE_DEVICE = 64
BYTES_PER_LOOKUP = 16


def check_limit(value: int, limit: int, what: str) -> None:
    """`what` (an option or a column) beyond `limit`: a one-line error naming both."""
    if value > limit:
        raise DreamShardError(f"{what}: {value} is more than {limit}, the most this tool accepts "
                              f"(dreamshard.limits)")


def check_search_scale(sharder: str, num_tables: int, num_devices: int, time_limited: bool) -> None:
    """Refuse, before any work, a search sharder (SEARCH_SCALE) on a task past the size it plans in minutes,
    unless it is given a time limit."""
    scale = SEARCH_SCALE.get(sharder)
    if scale is None or time_limited:
        return
    tables, pairs = scale
    if num_tables <= tables and num_tables * num_devices <= pairs:
        return
    raise DreamShardError(f"--algo {sharder}: {num_tables} tables on {num_devices} devices is past the size it plans "
                          f"within minutes (at most {tables} tables and tables x devices {pairs}: dreamshard.limits); "
                          "give --time-limit SECONDS to keep the best plan it finds by then, or plan with another "
                          "sharder")


def available_memory_bytes() -> int:
    """Memory this process could still allocate: psutil's `available`, else /proc/meminfo's MemAvailable."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise DreamShardError("/proc/meminfo: no MemAvailable line; cannot tell the memory available")


def cost_memory_bytes(num_devices: int, num_tables: int, batch_size: int, lookups_per_device: Sequence[float] = (),
                      weights_bytes: int = 0) -> int:
    """What costing a plan allocates at most: the all-to-all model's per-device arrays, per (table, device)
    arrays, the largest device's lookups of one batch and (fbgemm) its weights."""
    lookups = max(lookups_per_device, default=0.0) * batch_size * BYTES_PER_LOOKUP
    return int(BYTES_PER_DEVICE * num_devices + BYTES_PER_TABLE_DEVICE * num_tables * num_devices
               + lookups + weights_bytes)


def check_memory(needed: int, what: str, advice: str = "cost fewer devices or tables, or run on a larger machine") -> None:
    """Refuse before allocating `needed` bytes for `what` when the machine has less available."""
    have = available_memory_bytes()
    if needed > have:
        raise DreamShardError(f"{what} would need about {needed / 2**30:.1f} GiB of memory, but {have / 2**30:.1f} "
                              f"GiB are available; {advice}")
