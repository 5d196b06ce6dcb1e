"""Pass 6 of benchmarks/fold_probe (results/holdout/fold-probe): wide tables with dims folded at weight k**BETA
(plain) against weight k (`@pooling`, which on these tables folds dims alone) and unfolded. Run from the repository
root: PYTHONPATH=.:results/holdout/fold-probe python -m pass6_dim_weight BETA TASKS SEED OUT (pass 6: 0.5 6 1 DIR).
Pass 6 ran a copy of pass4_dim_weight.py's fold at BETA; since fe3982c the library's fold takes the exponent, so
this overrides a checkpoint's own (the same weights)."""
import sys
from dataclasses import replace

import dreamshard.learning.features as F

BETA = float(sys.argv[1])
library_fold = F.FeatureScaler.fold


def fold(self, raw):
    return library_fold(replace(self, fold_exponent=1.0 if "pooling_factor" in self.folds else BETA), raw)


F.FeatureScaler.fold = fold
import benchmarks.fold_probe as fp  # noqa: E402

sys.argv = ["fold_probe", "--tasks", sys.argv[2], "--seed", sys.argv[3], "--kinds", "wide", "--out", sys.argv[4]]
fp.main()
