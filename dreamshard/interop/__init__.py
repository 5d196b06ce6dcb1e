"""Interop: TorchRec ShardingPlan export and TorchRec's performance estimate."""
