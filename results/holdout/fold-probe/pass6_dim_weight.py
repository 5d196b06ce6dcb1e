"""Pass 6 of benchmarks/fold_probe (results/holdout/fold-probe): wide tables with dims folded at weight k**BETA
(plain) against weight k (`@pooling`, which on these tables folds dims alone) and unfolded. Run from the repository
root: PYTHONPATH=.:results/holdout/fold-probe python -m pass6_dim_weight BETA TASKS SEED OUT (pass 6: 0.5 6 1 DIR)."""
import sys, numpy as np
import dreamshard.learning.features as F
from dreamshard.learning.features import FeatureScaler
BETA = float(sys.argv[1])
def fold(self, raw):
    x = np.array(raw, dtype=np.float64, copy=True).reshape(-1, F.NUM_FEATURES); w = np.ones(len(x))
    if self.high is None or 'dim' not in self.folds: return x, w
    high = self.high[F.RANGE_FEATURES.index('dim')]
    dim, size = F.FEATURE_NAMES.index('dim'), F.FEATURE_NAMES.index('size_gb')
    k = np.where(x[:, dim] > high * (1 + F.RANGE_SLACK), np.ceil(x[:, dim] / high), 1.0)
    x[:, dim] /= k; x[:, size] /= k
    return x, w * k ** (1.0 if 'pooling_factor' in self.folds else BETA)
FeatureScaler.fold = fold
import benchmarks.fold_probe as fp
sys.argv = ['fold_probe', '--tasks', sys.argv[2], '--seed', sys.argv[3], '--kinds', 'wide', '--out', sys.argv[4]]
fp.main()
