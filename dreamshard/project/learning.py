"""The learned models, for the stages, benchmarks, experiments and tools: DreamShard's cost network (and its
accuracy figure), NeuroShard's cost models, the RNN baseline, the single-device data the cost models learn from,
the tables' features (dreamshard.learning). The project's fits and training loops: cost_network,
policy_training, learners."""
from __future__ import annotations

from dreamshard.evaluation.figures import cost_model_scatter
from dreamshard.learning.cost_model import (
    NetworkEstimate,
    device_predictions,
    evaluate_cost_net,
    fit_fold_exponent,
    kendall_tau,
    load_cost_net,
    measurement_noise,
    plan_predictions,
    save_cost_net,
)
from dreamshard.learning.devices import (
    DeviceJournal,
    DeviceSample,
    cost_data_from_device_rows,
    device_samples,
    measure_samples,
    pending,
)
from dreamshard.learning.features import FOLDABLE, FOLDED, FeatureScaler, table_features
from dreamshard.learning.neuroshard import (
    AugmentConfig,
    NeuroShardModel,
    comm_dataset,
    comm_mape,
    fit_comm_net,
    fit_compute_net,
)
from dreamshard.learning.rnn import RnnPolicyConfig, RnnTrainConfig, RnnUpdateLog, train_rnn

__all__ = [
    "FOLDABLE", "FOLDED", "AugmentConfig", "DeviceJournal", "DeviceSample", "FeatureScaler", "NetworkEstimate",
    "NeuroShardModel", "RnnPolicyConfig",
    "RnnTrainConfig", "RnnUpdateLog", "comm_dataset", "comm_mape", "cost_data_from_device_rows", "cost_model_scatter",
    "device_predictions", "device_samples", "evaluate_cost_net", "fit_comm_net", "fit_compute_net", "fit_fold_exponent",
    "kendall_tau",
    "load_cost_net", "measure_samples", "measurement_noise", "pending", "plan_predictions", "save_cost_net",
    "table_features", "train_rnn",
]
