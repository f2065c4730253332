"""Whether each dataset x variant's validation loss was still falling when training ended: the
table behind ``convergence.csv`` and the Findings' line on it. Losses in nats/char."""

from __future__ import annotations

import numpy as np
import pandas as pd

TAIL = 0.2  # the share of training at the end over which a curve counts as still falling
CONVERGENCE_COLUMNS = ["dataset", "variant", "seeds", "from_step", "last_step",
                       "val_loss_from", "val_loss_last", "drop", "seeds_falling"]


def convergence_table(history: pd.DataFrame, tail: float = TAIL) -> pd.DataFrame:
    """Per dataset x variant (columns :data:`CONVERGENCE_COLUMNS`), each seed's validation loss
    (nats/char) at its last step against that at ``1 - tail`` of it: ``drop`` the mean of
    ``from - last`` (> 0: still falling), ``seeds_falling`` how many fell."""
    if history.empty or "val_loss" not in history:
        return pd.DataFrame(columns=CONVERGENCE_COLUMNS)
    rows = []
    h = history.dropna(subset=["val_loss"])
    for (dataset, variant), d in h.groupby(["dataset", "variant"], observed=True, sort=False):
        per_seed = []
        for _, s in d.groupby("seed", sort=True):
            s = s.sort_values("step")
            earlier = s[s["step"] <= (1 - tail) * s["step"].iloc[-1]]
            if len(earlier):
                per_seed.append([x.iloc[-1] for x in (earlier["step"], s["step"],
                                                      earlier["val_loss"], s["val_loss"])])
        if per_seed:
            step0, step1, loss0, loss1 = np.array(per_seed, dtype=float).T
            rows.append({"dataset": dataset, "variant": variant, "seeds": len(step0),
                         "from_step": int(np.median(step0)), "last_step": int(np.median(step1)),
                         "val_loss_from": float(loss0.mean()), "val_loss_last": float(loss1.mean()),
                         "drop": float((loss0 - loss1).mean()),
                         "seeds_falling": int((loss0 > loss1).sum())})
    return pd.DataFrame(rows, columns=CONVERGENCE_COLUMNS)
