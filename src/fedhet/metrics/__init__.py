"""The built-in columns of ``metrics.csv`` (a row per evaluated round) and ``clients.csv``, in one place (metric
plugins declare their own, `fedhet.metrics.base.Metric.columns`).

Client-level numbers are averaged over clients with equal weight (the papers' "average user accuracy");
``*_pooled`` variants weight clients by their number of samples. Unless prefixed with ``unseen_``, metrics
are over the seen (training) clients.
"""

METRICS: dict[str, str] = {
    "round": "number of completed rounds (1-based)",
    "test_accuracy": "mean over clients of the global model's accuracy on each client's test data",
    "test_accuracy_std": "standard deviation of per-client test accuracy (fairness)",
    "test_accuracy_worst10": "mean test accuracy of the worst 10% of clients",
    "test_accuracy_best10": "mean test accuracy of the best 10% of clients",
    "test_accuracy_pooled": "test accuracy over all clients' test samples pooled (sample-weighted)",
    "test_loss": "mean over clients of the global model's test loss",
    "train_loss": "mean over clients of the global model's loss on each client's training data",
    "train_accuracy": "mean over clients of the global model's training accuracy",
    "local_loss": "mean over the cohort of the mini-batch loss during local training",
    "participants": "number of clients that trained this round",
    "available": "number of clients online this round",
    "unseen_test_accuracy": "as test_accuracy, over the unseen (held-out) clients",
    "unseen_test_loss": "as test_loss, over the unseen (held-out) clients",
    "evaluated": "number of seen clients evaluated this round (with eval_clients)",
    "personal_test_accuracy": "mean over clients of their personalised model's accuracy on their own test data "
    "(personal_eval)",
    "personal_test_accuracy_std": "standard deviation of the personalised models' test accuracy",
    "personal_test_accuracy_worst10": "mean personalised test accuracy of the worst 10% of clients",
    "personal_test_accuracy_best10": "mean personalised test accuracy of the best 10% of clients",
    "personal_test_loss": "mean over clients of their personalised model's test loss",
    "personal_appeal": "share of clients whose personalised model's test loss is below their requirement ρ_k "
    "(the loss of a model trained on their data alone)",
    "unseen_personal_test_accuracy": "as personal_test_accuracy, over the unseen clients (after the same steps)",
    "unseen_personal_test_loss": "as personal_test_loss, over the unseen clients",
    "unseen_personal_appeal": "as personal_appeal, over the unseen clients",
    "test_accuracy_worst_group": "the lowest over ground-truth groups (shift) of the group's mean test accuracy "
    "(test_accuracy_group<g>: group g's)",
    "personal_test_accuracy_worst_group": "as test_accuracy_worst_group, of the personalised models "
    "(personal_test_accuracy_group<g>: group g's)",
    "test_accuracy_worst_arch": "the lowest over architectures (model: architectures) of the mean test accuracy of "
    "the clients of an architecture under its global model (test_accuracy_arch<a>: architecture a's)",
    "personal_test_accuracy_worst_arch": "as test_accuracy_worst_arch, of the personalised models "
    "(personal_test_accuracy_arch<a>: architecture a's)",
    "prototype_classes": "fedproto: the number of classes that have a global prototype",
    "ari": "adjusted Rand index of the clients' last chosen clusters against their ground-truth groups (shift; "
    "IFCA, CFL), over the clients that chose one",
    "clusters": "number of cluster models (CFL)",
    "update_norm_mean": "CFL: norm of the weighted mean update of the largest cluster this round (against ε1)",
    "update_norm_max": "CFL: largest norm of a client update of the largest cluster this round (against ε2)",
    "time_s": "simulated seconds since the run started (with a system model)",
    "bytes_down": "bytes sent to clients so far (with a system model)",
    "bytes_up": "bytes received from clients so far (with a system model)",
    "late_clients": "clients of the round left out by its deadline (with a system model)",
    "staleness": "mean staleness t − τ of the updates of an asynchronous server step",
    "in_flight": "clients training when an asynchronous server step was taken",
    "val_accuracy": "mean over clients of the global model's accuracy on each client's validation data (val_fraction)",
    "val_loss": "mean over clients of the global model's loss on each client's validation data (val_fraction)",
    "dp_epsilon": "client-level DP: ε spent so far at privacy.delta (the largest client's, with local noise)",
    "dp_sgd_epsilon": "example-level DP-SGD: the largest ε spent so far by a client at privacy.delta",
    "dp_noise_multiplier": "client-level DP: z, the noise's standard deviation over the clipping bound",
    "dp_sgd_noise_multiplier": "DP-SGD: z, the noise's standard deviation over the per-sample clipping bound",
    "dp_clip_bound": "client-level DP: the clipping bound C of the round (adaptive clipping moves it)",
    "dp_clipped_share": "client-level DP: share of the round's updates that were clipped",
    "dp_noise_std": "client-level DP: standard deviation of the noise on the aggregate (central) or on each update",
    "dp_clipped_often": "share of the clients that trained whose updates were clipped in at least half their rounds",
    "test_accuracy_size_q1": "mean test accuracy of the quarter of clients with the smallest training sets "
    "(q2, q3, q4: the next quarters; DP runs)",
    "test_accuracy_clipped_often": "mean test accuracy of the clients clipped in at least half their rounds (DP runs)",
    "test_accuracy_clipped_rarely": "mean test accuracy of the other clients that trained (DP runs)",
}
# a task's own metrics (`fedhet.engine.task`): test_<name> is the mean over the clients where it is defined,
# test_<name>_pooled the value over all their test samples pooled; val_ and unseen_test_ variants likewise
TASK_METRICS: dict[str, str] = {
    "auc": "ROC AUC of the positive class (task binary; defined for clients with both classes)",
    "f1": "F1 score of the positive class (task binary)",
    "balanced_accuracy": "mean of the recall of each class present (task binary)",
    "mae": "mean absolute error (task regression)",
    "rmse": "root mean squared error (task regression)",
    "r2": "coefficient of determination R² against the clients' own mean target (task regression)",
}
for _name, _text in TASK_METRICS.items():
    METRICS[f"test_{_name}"] = f"mean over clients of the global model's {_text}"
    METRICS[f"test_{_name}_pooled"] = f"{_text}, over all test samples pooled"
    METRICS[f"val_{_name}"] = f"as test_{_name}, on the validation data"
    METRICS[f"val_{_name}_pooled"] = f"as test_{_name}_pooled, on the validation data"
    METRICS[f"unseen_test_{_name}"] = f"as test_{_name}, over the unseen clients"
    METRICS[f"personal_test_{_name}"] = f"mean over clients of their personalised model's {_text} (personal_eval)"
    METRICS[f"personal_test_{_name}_pooled"] = f"as personal_test_{_name}, over all test samples pooled"
    METRICS[f"unseen_personal_test_{_name}"] = f"as personal_test_{_name}, over the unseen clients"

CLIENT_COLUMNS: dict[str, str] = {
    "client": "the client's id",
    "group": "the client's ground-truth group (shift)",
    "architecture": "the client's architecture: its member of model: architectures (0, 1, ...)",
    "shift_level": "the level of the client's shift (its group's, or its own: a noise std, a blur sigma, an angle)",
    "seen": "1 for a client that trains, 0 for an unseen (held-out) one",
    "system_capacity": "the largest width level the client can hold (system.capacity)",
    "train_samples": "the client's training samples",
    "test_samples": "the client's test samples",
    "test_accuracy": "the global model's accuracy on the client's test data",
    "test_loss": "the global model's loss on the client's test data",
    "train_accuracy": "the global model's accuracy on the client's training data",
    "train_loss": "the global model's loss on the client's training data",
    "personal_test_accuracy": "the client's personalised model's accuracy on its test data (personal_eval)",
    "personal_test_loss": "the client's personalised model's loss on its test data (personal_eval)",
    "val_samples": "the client's validation samples (val_fraction)",
    "val_accuracy": "the global model's accuracy on the client's validation data",
    "val_loss": "the global model's loss on the client's validation data",
    "user": "the client's user (site) name, when each client is one user of the data (a natural split)",
    **{f"test_{name}": f"the global model's {text} on the client's test data" for name, text in TASK_METRICS.items()},
    **{
        f"personal_test_{name}": f"the client's personalised model's {text} on its test data (personal_eval)"
        for name, text in TASK_METRICS.items()
    },
    "size_quartile": "the quartile (1-4) of the client's training-set size among the clients that train (DP runs)",
    "dp_rounds": "client-level DP: rounds the client took part in",
    "dp_clipped": "client-level DP: rounds whose update from the client was clipped",
    "dp_clip_rate": "client-level DP: dp_clipped / dp_rounds",
    "dp_epsilon": "client-level DP with local noise: the client's ε at privacy.delta",
    "dp_sgd_steps": "DP-SGD: the client's noisy local steps",
    "dp_sgd_epsilon": "DP-SGD: the client's ε at privacy.delta",
}
