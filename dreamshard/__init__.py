"""DreamShard: embedding table placement for recommender models."""
from dreamshard.errors import DataFormatError, DreamShardError, InfeasibleTaskError, InvalidPlanError
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, Shard, validate_plan
from dreamshard.sharders import SHARDERS, make_sharder
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task

__all__ = [
    "DataFormatError", "DreamShardError", "InfeasibleTaskError", "InvalidPlanError",
    "MemoryModel", "Plan", "Shard", "validate_plan", "SHARDERS", "make_sharder",
    "Table", "Device", "Task",
]
