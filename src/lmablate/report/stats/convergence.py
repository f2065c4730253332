"""Whether each dataset x variant's validation loss was still falling when training ended: the
table behind ``convergence.csv`` and the Findings' line on it. Losses in nats/char.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TAIL = 0.2  # the share of training at the end over which a curve counts as still falling
CONVERGENCE_COLUMNS = ["dataset", "variant", "seeds", "from_step", "last_step",
                       "val_loss_from", "val_loss_last", "drop", "seeds_falling"]


def convergence_table(history: pd.DataFrame, tail: float = TAIL) -> pd.DataFrame:
    """Whether each dataset x variant's validation loss was still falling when training ended.

    Per seed: the validation loss (nats/char) at the last evaluated step, against the last
    evaluation at or before ``1 - tail`` of that step; ``drop`` is the mean over seeds of
    ``from - last`` (positive: still falling), ``seeds_falling`` how many seeds fell. A curve
    that fell on every seed of five is unlikely to be flat noise (a sign test gives 1/32).

    Returns:
        Columns :data:`CONVERGENCE_COLUMNS`, in the order of ``history``; empty without
        ``val_loss``.
    """
    if history.empty or "val_loss" not in history:
        return pd.DataFrame(columns=CONVERGENCE_COLUMNS)
    rows = []
    h = history.dropna(subset=["val_loss"])
    for (dataset, variant), d in h.groupby(["dataset", "variant"], observed=True, sort=False):
        per_seed = []
        for _, s in d.groupby("seed", sort=True):
            s = s.sort_values("step")
            last = s.iloc[-1]
            earlier = s[s["step"] <= (1 - tail) * last["step"]]
            if earlier.empty:
                continue
            first = earlier.iloc[-1]
            per_seed.append((int(first["step"]), int(last["step"]), float(first["val_loss"]),
                             float(last["val_loss"])))
        if not per_seed:
            continue
        a = np.array(per_seed, dtype=float)
        rows.append({"dataset": dataset, "variant": variant, "seeds": len(a),
                     "from_step": int(np.median(a[:, 0])), "last_step": int(np.median(a[:, 1])),
                     "val_loss_from": float(a[:, 2].mean()), "val_loss_last": float(a[:, 3].mean()),
                     "drop": float((a[:, 2] - a[:, 3]).mean()),
                     "seeds_falling": int((a[:, 2] > a[:, 3]).sum())})
    return pd.DataFrame(rows, columns=CONVERGENCE_COLUMNS)
