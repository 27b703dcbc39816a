"""XGBoost cost model over CPU-strategy configurations."""

import math

import numpy as np

MAX_LOOPS = 8


def features(config, outer_extents, threads):
    """Numeric features of a CpuConfig for a workload's outer data-parallel extents."""
    unroll = dict(config.unroll)
    factors = [unroll.get(i, 1) for i in range(len(outer_extents))]
    rem = [e // f for e, f in zip(outer_extents, factors)]
    par = min(config.parallel, len(rem))
    fused = math.prod(rem[:par]) if par else 1
    acc = math.prod(factors)
    fs = sorted((f for f in factors if f > 1), reverse=True) + [1, 1]
    reuse = fs[0] * fs[1] / (fs[0] + fs[1])
    chunks = fused / threads
    balance = fused / (math.ceil(fused / threads) * threads)
    serial = math.prod(rem[par:]) if par < len(rem) else 1
    pos = [math.log2(f) for f in factors][-MAX_LOOPS:]
    pos = [0.0] * (MAX_LOOPS - len(pos)) + pos
    return np.array(pos + [acc, math.log2(acc), reuse, par, math.log2(max(fused, 1)),
                           math.log2(max(chunks, 1e-3)), balance, math.log2(serial)], np.float32)


class CostModel:
    """Predicts log GOPS of a configuration from what has been measured."""

    def __init__(self, seed=0):
        self.seed = seed
        self.model = None

    def fit(self, xs, ys):
        import xgboost

        data = xgboost.DMatrix(np.stack(xs),
                               label=np.log(np.maximum(np.asarray(ys, np.float64), 1e-6)))
        params = {"max_depth": 3, "eta": 0.2, "seed": self.seed, "nthread": 1,
                  "objective": "reg:squarederror"}
        self.model = xgboost.train(params, data, num_boost_round=60)
        return self

    def predict(self, xs):
        if self.model is None:
            return np.zeros(len(xs))
        import xgboost

        return self.model.predict(xgboost.DMatrix(np.stack(xs)))
