"""Membership inference from per-sample losses: was a sample in the model's training data?

- ``loss`` (Yeom, Giacomelli, Fredrikson and Jha, "Privacy Risk in Machine Learning", CSF 2018, §3.2): a sample
  is called a member when its loss is low; the attack score is −ℓ(w; x, y). Sweeping the threshold gives the
  ROC curve, hence the attack's AUC and its TPR at 1% FPR (Carlini et al. 2022's low-FPR view).
- ``calibrated`` (Watson, Guo, Cormode and Sablayrolles, "On the Importance of Difficulty Calibration in Membership
  Inference Attacks", ICLR 2022, Eq. 2): the score is ℓ(w_ref; x, y) − ℓ(w; x, y), the loss of a reference model
  minus the target's, so that samples that are hard for any model are not called non-members. Shadow-free here:
  the reference is a model that did not train on the sample's owner alone (the global model, when the target is
  a client's personal model); without one it falls back to ``loss``.

AUC 0.5 is a coin flip; the scores of members and non-members are compared with sklearn's ``roc_curve``.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve
from torch import Tensor


def attack_scores(losses: Tensor, reference: Tensor | None = None) -> Tensor:
    """Membership scores (higher: more likely a member): −ℓ, or ℓ_ref − ℓ when `reference` losses are given."""
    return -losses if reference is None else reference - losses


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float) -> float:
    """The largest true-positive rate of a threshold whose false-positive rate is at most `fpr`."""
    fprs, tprs, _ = roc_curve(labels, scores)
    ok = fprs <= fpr
    return float(tprs[ok].max()) if ok.any() else 0.0


def evaluate(member: Tensor, nonmember: Tensor, fpr: float = 0.01) -> tuple[float, float]:
    """(AUC, TPR at `fpr`) of scores of members against those of non-members (NaN when either side is empty)."""
    if len(member) == 0 or len(nonmember) == 0:
        return math.nan, math.nan
    labels = np.concatenate([np.ones(len(member)), np.zeros(len(nonmember))])
    scores = np.concatenate([member.double().numpy(), nonmember.double().numpy()])
    if not np.isfinite(scores).all():
        scores = np.nan_to_num(scores, nan=-np.inf)
        scores = np.clip(scores, -np.finfo(float).max, np.finfo(float).max)
    return float(roc_auc_score(labels, scores)), tpr_at_fpr(labels, scores, fpr)
