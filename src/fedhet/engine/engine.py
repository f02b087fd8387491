"""The engine: one object that trains cohorts and scores models, whatever the strategy."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.conv import conv_is_faster, conv_layers
from fedhet.engine.dense import dense_layers
from fedhet.engine.evaluate import (
    ClientScores,
    personal_columns,
    sampled_losses,
    score_clients,
    score_own_models,
    score_split_dense,
    scores_of_some,
)
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import RULE_STATE, Backend, gradient_statistics, train_cohort
from fedhet.engine.memory import keep_freed_memory
from fedhet.engine.numerics import Precision, exact_float32, mixed_precision
from fedhet.engine.personal import gather, parameter_mask, scatter_, spans
from fedhet.engine.plan import PHASES, LocalPlan, LocalResult, LocalSettings
from fedhet.engine.privacy import add_noise, clip_rows, noise_key
from fedhet.engine.protocol import Split
from fedhet.engine.request import CLIPPED, TrainRequest
from fedhet.engine.reuse import Reuse
from fedhet.engine.state import ClientStore
from fedhet.engine.state_store import PersonalState, TableStore, choose_personal_state
from fedhet.engine.step import Cohort, fresh_cohort
from fedhet.engine.vmap_probe import probe_vmap
from fedhet.errors import ConfigError, FedhetNote, FedhetWarning

BackendChoice = Literal["auto", "sequential", "vectorised", "dense", "conv"]

# For models neither the dense nor the conv backend can run (LSTMs, CNNs of other layers; every model under an
# objective that needs autograd): vmap beats the per-client loop for small models and cohorts of 10 or more
# (docs/performance.md, "Why the engine's constants"); larger models stay sequential.
VECTORISE_MAX_PARAMS = 100_000
PERSONAL_BLOCK = 64  # clients whose personal models are put together and scored at once
VECTORISE_MIN_COHORT = 10


def resolve_device(device: str) -> torch.device:
    """The torch device for the config's `device` ("cpu", "cuda", "cuda:1"), with a clear error if absent."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"device '{device}' is not a torch device; use 'cpu' or 'cuda'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' asked for, but torch sees no CUDA GPU here; use device: cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device '{device}': fedhet runs on 'cpu' or 'cuda'")
    return dev


def resolve_backend(
    choice: BackendChoice,
    model: FlatModel,
    cohort: int = VECTORISE_MIN_COHORT,
    device: torch.device | None = None,
    autograd_only: bool = False,
    batch_size: int = 0,
    dense_runs: bool | None = None,
) -> Backend:
    """`auto` picks `dense` for networks of Linear layers and ReLU/Tanh/Sigmoid (fastest on every workload
    of `fedhet bench`), and `conv` on a CPU for the CNNs `conv_layers` recognises (every CNN of the zoo; the
    fastest on one core and on two, docs/performance.md), unless the objective needs autograd (a data term or a
    local rule) or a step's activations at `batch_size` are too large (`conv_is_faster`: then `sequential`); for
    other models, vectorised for models of at most 100k parameters and cohorts of at least 10
    clients when torch has two threads or more, and for every objective with a local rule, else sequential (on
    a GPU: always vectorised); sequential where vmap cannot run the model. All give the same numbers. `dense_runs`
    (default: not `autograd_only`) says whether the dense backend runs the objective all the same (DP-SGD: its
    per-sample gradient norms by ghost clipping, `Cohort.dense_runs`)."""
    dense_runs = not autograd_only if dense_runs is None else dense_runs
    if choice == "dense":
        if dense_layers(model) is None:
            raise ConfigError(
                "backend 'dense' needs a model of Linear layers with ReLU/Tanh/Sigmoid activations (and optional "
                "dropout); use backend 'auto', 'vectorised' or 'sequential' for this model"
            )
        if not dense_runs:
            raise ConfigError(
                "backend 'dense' cannot run this local objective (a data-space term or a local rule needs "
                "autograd); use backend 'auto', 'vectorised' or 'sequential'"
            )
    if choice == "conv":
        if conv_layers(model) is None:
            raise ConfigError(
                "backend 'conv' needs a CNN of Conv2d (zero padding), max/avg pooling, ReLU/Tanh/Sigmoid, "
                "LocalResponseNorm/GroupNorm, dropout, Flatten and Linear layers starting from an image (the zoo's "
                "CNNs); use backend 'auto', 'vectorised' or 'sequential' for this model"
            )
        if autograd_only:
            raise ConfigError(
                "backend 'conv' cannot run this local objective (a data-space term, a local rule or DP-SGD's "
                "per-sample gradients need autograd); use backend 'auto', 'vectorised' or 'sequential'"
            )
    probe = model.vmap_probe
    if choice == "vectorised" and probe is not None and probe.failure is not None:
        raise ConfigError(f"backend 'vectorised' cannot run this model ({probe.failure}); use 'sequential'")
    if choice != "auto":
        return choice
    if dense_layers(model) is not None and dense_runs:
        return "dense"
    on_cpu = device is None or device.type == "cpu"
    spec = conv_layers(model) if on_cpu and not autograd_only else None
    if spec is not None:
        return "conv" if conv_is_faster(spec, batch_size) else "sequential"
    if probe is not None and (probe.failure or probe.slow):
        return "sequential"
    if device is not None and device.type != "cpu":
        return "vectorised"
    small = model.size <= VECTORISE_MAX_PARAMS and cohort >= VECTORISE_MIN_COHORT
    return "vectorised" if autograd_only or (small and torch.get_num_threads() >= 2) else "sequential"


class Engine:
    """Local training and evaluation for every algorithm (strategies never write a training loop).

    The native implementation of `EngineProtocol` (`fedhet.engine.protocol`): everything a strategy or metric
    asks of the clients goes through these methods, so that `fedhet.flower.remote.RemoteEngine` can send the
    same calls to the machines that hold the data. The clients' own state (terms' rows, persistent optimiser
    state) lives in ``client_state``.
    """

    def __init__(
        self,
        model: FlatModel,
        data: FederatedData,
        *,
        backend: BackendChoice = "auto",
        seed: int = 0,
        chunk_size: int = 0,
        local: LocalSettings | None = None,
        device: str = "cpu",
        precision: Precision = "float32",
    ) -> None:
        self.model = model
        self.precision: Precision = precision  # local training under torch.autocast (`mixed_precision`)
        self.data = data
        self.device = resolve_device(device)
        if self.device.type != "cpu" and backend == "sequential":
            raise ConfigError("backend 'sequential' runs on the CPU only: use 'auto', 'dense' or 'vectorised' on a GPU")
        self._placed: dict[str, ClientData] = {}  # the data on `device`, moved once
        # dense networks always vectorise and CNNs train on `conv`; probing costs vmap's first use (seconds), so
        # only the others are probed now (and CNNs when an objective needs autograd: `backend_for`)
        fast = dense_layers(model) is not None or (self.device.type == "cpu" and conv_layers(model) is not None)
        if backend == "vectorised" or (backend == "auto" and not fast):
            self._probe(backend)
        resolve_backend(backend, model)  # a backend the model cannot use fails here, with a clear message
        if precision != "float32" and backend in ("dense", "conv"):
            raise ConfigError(
                f"precision {precision} runs local training under torch.autocast, which the {backend} backend's "
                "hand-written products do not follow; use backend auto or vectorised (or precision float32)"
            )
        keep_freed_memory()  # per-round (cohort × parameters) tensors reuse memory instead of page-faulting
        self.backend: BackendChoice = backend
        self.seed = seed
        self.chunk_size = chunk_size
        self.local = local or LocalSettings(steps=10, lr=0.05, batch_size=10)  # the run's default local training
        self.client_state = ClientStore()  # state the clients keep between rounds (see `fedhet.engine.state`)
        self.state_history = 1  # rounds a run may be rewound by and still find the clients' state (a checkpoint's age)
        self._step_mask_note = False  # said once: dense/conv hand per-step sub-models to another backend
        self.last_backend: str | None = None  # what trained the last cohort (objectives may rule out a backend)
        self.reuse = Reuse()  # products of the round's mini-batches a second training may reuse (Ditto's)
        self._masks: dict[tuple[str, ...], Tensor] = {}  # `mask`'s answers
        self._recomputed: tuple[Tensor, Tensor] | None = None  # `evaluated`'s last (model, model as scored)

    def place_client_state(
        self, mode: PersonalState, folder: Path | None, claim: Callable[[str], None] | None = None
    ) -> str:
        """Keep the clients' state where `mode` says (`fedhet.engine.state_store`): ``memory`` (the `ClientStore`),
        ``disk`` (tables mapped onto files in run folder `folder`, each name given to `claim` first) or ``auto``;
        returns where it lives. Called before a checkpoint is loaded (`load_state_dict`) and before training."""
        where = choose_personal_state(mode, self.data.num_clients, self.model.size, folder is not None)
        if where == "disk":
            if folder is None:
                raise ConfigError(
                    "personal_state 'disk' keeps the clients' rows in the run folder: give the run a folder, or use "
                    "personal_state memory or auto"
                )
            self.client_state = TableStore(self.data.num_clients, folder, claim)
        return where

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        """Local training of the plan's cohort from `global_params` (or the clients' personal models, with
        ``plan.personal``), with the clients' stored state; their new state and personal parts are stored. With
        ``plan.clip`` each client's update (what it sends: the shared part) is clipped and noised as the client
        would (`fedhet.engine.privacy.clip_updates`; the dense backend clips as it writes the models where nothing
        reads them unclipped, `TrainRequest.clip`). With ``plan.masks`` each client starts with the coordinates
        outside its mask at zero and returns them as zero (a sub-model: `LocalPlan`)."""
        cohort, starts, (params, losses, state) = self._run(global_params, plan, round_, clip=True)
        clipped = state.pop(CLIPPED, None)
        self.last_backend = self.backend_for(
            len(plan.clients), cohort.autograd_only, plan.batch_size, cohort.dense_runs, plan.step_masks is not None
        )
        result = LocalResult(plan.clients, params, losses, plan.steps, plan.lr)
        anchor = starts if starts is not None else global_params
        result.state_delta = self.keep_state(plan, cohort, anchor, result, state, round_)
        if plan.personal is not None:
            self._keep_personal(plan, global_params, result, state, round_)
        if plan.clip is not None:  # client-level DP: the update each client sends, clipped (and noised) by it
            if clipped is None:  # not clipped by the backend
                clipped = clip_rows(result.params, global_params, plan.clip.bound)
            add_noise(result.params, plan.clip, plan.clients, self.seed, round_, noise_key(plan.stream, plan.phase))
            result.clipped = clipped
        self.client_state.prune(self._keep_from(round_))
        return result

    def personal_scores(
        self, global_params: Tensor, plan: LocalPlan, round_: int, split: Split = "test"
    ) -> ClientScores:
        """Loss and accuracy of each of the plan's clients' own model on its own `split` data: its personal model
        (with ``plan.personal``; the global model's shared part) or the global model, after the plan's steps on
        its training data (none: as it is; with ``plan.starts``, each client's start). Nothing is stored:
        evaluation leaves every client as it was."""
        if bool((plan.steps > 0).any()):
            _, _, (params, _, _) = self._run(global_params, plan, round_)
            return self.own_scores(params, plan.clients, split)
        if plan.starts is not None:  # each client's model is its given start (IFCA's cluster model)
            return self.own_scores(plan.starts, plan.clients, split)
        if plan.personal is None:  # every client's model is the global one
            return self.scores(global_params, split, plan.clients).select(plan.clients)
        layers = dense_layers(self.model)
        data = self.placed(split) or self.split(split)
        mine = self.mask(plan.personal.parts, plan.personal.what)
        columns = personal_columns(layers, mine) if layers is not None else []
        shared = global_params.to(data.x.device)
        parts = []  # a block of clients at a time: no (m, P) copy of every personal model
        for block in torch.split(torch.arange(len(plan.clients)), PERSONAL_BLOCK):
            some = plan.rows(block)
            if layers is None:
                starts = self.personal_starts(global_params, some, round_)
                assert starts is not None
                parts.append(self.own_scores(starts, some.clients, split))
                continue
            rows = self.personal_rows(global_params, some, round_).to(data.x.device)
            with exact_float32(self.device):
                parts.append(score_split_dense(layers, columns, shared, rows, data, some.clients, self.model.task))
        return ClientScores.concat(parts)

    def personal_starts(self, global_params: Tensor, plan: LocalPlan, round_: int) -> Tensor | None:
        """(m, P) the plan's clients' start points under ``plan.personal`` (None without it): the global model on
        the shared coordinates, each client's personal part (`personal_rows`) on the others."""
        if plan.personal is None:
            return None
        parts = spans(self.mask(plan.personal.parts, plan.personal.what))
        rows = self.personal_rows(global_params, plan, round_)
        if parts == [slice(0, self.model.size)]:
            return rows  # the whole model is personal
        return scatter_(global_params.unsqueeze(0).repeat(len(plan.clients), 1), parts, rows)

    def personal_rows(self, global_params: Tensor, plan: LocalPlan, round_: int) -> Tensor:
        """(m, |personal|) each of the plan's clients' personal part: its stored rows (the model's initial values, or
        the global model's, where it has none), mixed with the global model by α where the spec has a ``mix``."""
        personal = plan.personal
        assert personal is not None
        m, version = len(plan.clients), _version(round_, plan.phase)
        mask = self.mask(personal.parts, personal.what)
        fresh = self.model.initial_params if personal.fresh == "initial" else lambda: global_params
        rows = self.client_state.stacked(personal.key, plan.clients, version, lambda: fresh()[mask])
        if personal.mix is not None:
            alpha = torch.full((m,), personal.mix_initial)
            alpha = self.client_state.read(personal.mix, plan.clients, version, alpha).view(m, 1)
            rows = rows * alpha + global_params[mask] * (1 - alpha)  # not in place: `rows` may be the store's
        return rows

    def mask(self, patterns: tuple[str, ...], what: str) -> Tensor:
        """(P,) bool: the coordinates of the parameters `patterns` name (`parameter_mask`; `what` names them in its
        error), worked out once: not to be written into."""
        key = (*patterns, what)
        if key not in self._masks:
            self._masks[key] = parameter_mask(self.model, patterns, what)
        return self._masks[key]

    def _run(
        self, global_params: Tensor, plan: LocalPlan, round_: int, clip: bool = False
    ) -> tuple[Cohort, Tensor | None, tuple[Tensor, Tensor, dict[str, Tensor]]]:
        """The plan's local steps (nothing stored, and `last_backend` left as it is: evaluation does not train the
        run's cohorts): the cohort with its state as read, the start points, and the backend's (params, losses,
        state after the steps). With `clip`, the backend may clip the updates to ``plan.clip``'s bound where nothing
        reads them unclipped (no personal part, no term state: `TrainRequest.clip`)."""
        cohort = self.cohort(plan, global_params, round_)
        unread = plan.personal is None and not any(inputs.term.client_state for inputs in cohort.terms)
        bound = plan.clip.bound if clip and plan.clip is not None and unread else None
        starts = plan.starts if plan.starts is not None else self.personal_starts(global_params, plan, round_)
        if plan.masks is not None and starts is not None:  # sub-models: the coordinates outside a client's mask
            starts = torch.where(plan.masks, starts, 0.0)  # start (and stay) at zero (from the anchor: `train_cohort`)
        stepped = plan.step_masks is not None
        backend = self.backend_for(len(plan.clients), cohort.autograd_only, plan.batch_size, cohort.dense_runs, stepped)
        patterns = (*plan.frozen, *self.model.frozen)  # the plan's and the model's own (a LoRA model's base)
        frozen = self.mask(patterns, "local.frozen") if patterns else None
        request = TrainRequest(
            self.model,
            self.data.train,
            global_params,
            plan,
            cohort,
            self.seed,
            round_,
            self.chunk_size,
            starts=starts,
            frozen=frozen,
            clip=bound,
            reuse=self.reuse,
        )
        self.reuse.start_round(round_)
        with exact_float32(self.device), mixed_precision(self.device, self.precision):
            trained = train_cohort(request, backend, placed=self.placed("train"))
        return cohort, starts, trained

    def _keep_personal(
        self, plan: LocalPlan, global_params: Tensor, result: LocalResult, state: dict[str, Tensor], round_: int
    ) -> None:
        """Store the personal part of the clients that trained (unless every personal parameter was frozen) and
        send back the shared part only (the received model on the personal coordinates; where the whole model is
        personal, every row is the received model, as a read-only view)."""
        personal = plan.personal
        assert personal is not None
        mask = self.mask(personal.parts, personal.what)
        parts = spans(mask)
        trained = result.steps > 0
        frozen = self.mask(plan.frozen, "local.frozen") if plan.frozen else None
        whole = parts == [slice(0, self.model.size)] and plan.clip is None  # nothing shared, nothing clipped
        if bool(trained.any()) and (frozen is None or not bool(frozen[mask].all())):
            rows = gather(result.params if bool(trained.all()) else result.params[trained], parts)
            version, keep_from = _version(round_, plan.phase), self._keep_from(round_)
            self.client_state.write(personal.key, plan.clients[trained], rows, version, keep_from, adopt=whole)
        if whole:  # the store keeps the trained models' memory; the clients send back the received model
            result.params = global_params.expand(len(plan.clients), -1)  # a read-only view: no (m, P) copy
            return
        for part in parts:
            result.params[:, part] = global_params[part]

    def state_rows(self, key: str, clients: Tensor, round_: int, default: Tensor) -> Tensor:
        """The stored rows `key` of `clients` as round `round_` reads them (written by earlier rounds), into
        `default` (m, ...) where a client has none."""
        return self.client_state.read(key, clients, _version(round_, 0), default)

    def _keep_from(self, round_: int) -> int:
        """The oldest version of the clients' state a read may still ask for (`state_history` rounds back)."""
        return _version(round_ + 1 - self.state_history, 0)

    def _probe(self, backend: BackendChoice) -> None:
        """Find out once whether vmap can batch the model (`probe_vmap`), warning when it cannot or is slow."""
        model = self.model
        if model.vmap_probe is None:
            model.vmap_probe = probe_vmap(model, self.data.train)
        reason = model.vmap_probe.failure or model.vmap_probe.slow
        if reason is not None and backend == "auto":
            warnings.warn(
                f"torch.func.vmap cannot batch this model ({reason}); backend 'auto' trains clients one after "
                "another (sequential)",
                FedhetWarning,
                stacklevel=3,
            )
        elif model.vmap_probe.slow is not None:
            warnings.warn(
                f"backend 'vectorised' runs this model through vmap's per-sample fallback ({reason}): the same "
                "numbers, but slower than backend 'sequential'",
                FedhetWarning,
                stacklevel=3,
            )

    def backend_for(
        self,
        cohort: int,
        autograd_only: bool = False,
        batch_size: int | None = None,
        dense_runs: bool | None = None,
        step_masks: bool = False,
    ) -> Backend:
        """The backend that trains a cohort of this size (see `resolve_backend`) with mini-batches of `batch_size`
        (default: the run's) and an objective the dense backend runs or not (`dense_runs`, default: not
        `autograd_only`). A plan with per-step sub-models (`step_masks`, `LocalPlan.step_masks`) trains on the
        sequential or vectorised backend: with `dense` or `conv` chosen, on the one `auto` picks (a note says so)."""
        choice = self.backend
        if step_masks:
            autograd_only, dense_runs = True, False
            if choice in ("dense", "conv"):
                if not self._step_mask_note:
                    warnings.warn(
                        f"backend '{choice}' does not train per-step sub-models (FjORD's per-batch draws): these "
                        "cohorts train on the backend 'auto' picks for them (vectorised or sequential)",
                        FedhetNote,
                        stacklevel=3,
                    )
                    self._step_mask_note = True
                choice = "auto"
        unprobed = self.model.vmap_probe is None and dense_layers(self.model) is None
        if autograd_only and choice == "auto" and unprobed:
            self._probe("auto")  # a CNN with an objective that needs autograd: vectorised if vmap runs it well
        batch = self.local.batch_size if batch_size is None else batch_size
        autocast = self.precision != "float32"  # the dense and conv backends' own products ignore autocast
        runs = None if dense_runs is None else dense_runs and not autocast
        return resolve_backend(choice, self.model, cohort, self.device, autograd_only or autocast, batch, runs)

    def cohort(self, plan: LocalPlan, global_params: Tensor, round_: int) -> Cohort:
        """The plan's objective with the cohort's stored state (a term's initial state for clients never seen;
        the optimiser's stored state when it is persistent, else fresh; the rule's state)."""
        cohort = fresh_cohort(plan, global_params)
        read, version, key = self.client_state.read, _version(round_, plan.phase), _namespace(plan)
        for inputs in cohort.terms:
            term_key = inputs.term.state_key
            inputs.client = {n: read(key(term_key(n)), plan.clients, version, v) for n, v in inputs.client.items()}
        if plan.optimizer.persistent:
            opt_key = plan.optimizer.state_key
            cohort.opt_state = {k: read(key(opt_key(k)), plan.clients, version, v) for k, v in cohort.opt_state.items()}
        if plan.rule is not None:
            rule_key = plan.rule.state_key
            cohort.rule_state = {
                k: read(key(rule_key(k)), plan.clients, version, v) for k, v in cohort.rule_state.items()
            }
        return cohort

    def keep_state(
        self,
        plan: LocalPlan,
        cohort: Cohort,
        start: Tensor,
        result: LocalResult,
        state: dict[str, Tensor],
        round_: int,
    ) -> dict[str, Tensor]:
        """Store the clients' new state rows (clients that took no step keep theirs) after their steps from `start`
        (P,) or (m, P); return the change of the rows the terms report to the server. `state` is the backend's
        (the optimiser's state, the rule's under ``"rule/<name>"``)."""
        trained = result.steps > 0
        everyone = bool(trained.all())  # then no (m, P) copies for the rows that trained
        clients = plan.clients if everyone else plan.clients[trained]
        version, keep_from, key = _version(round_, plan.phase), self._keep_from(round_), _namespace(plan)
        deltas: dict[str, Tensor] = {}

        def write(name: str, rows: Tensor) -> None:
            self.client_state.write(key(name), clients, rows if everyone else rows[trained], version, keep_from)

        for inputs in cohort.terms:
            term = inputs.term
            for name in term.client_state:
                old = inputs.client[name]
                new = term.update_state(name, old, start, result.params, result.steps, result.lr)
                if not everyone:
                    new = torch.where(_rows(trained, new), new, old)
                write(term.state_key(name), new)
                if term.reports_state:
                    deltas[key(term.state_key(name))] = _difference(new, old)
        if plan.optimizer.persistent:
            for name in plan.optimizer.state_kinds():
                write(plan.optimizer.state_key(name), state[name])
        if plan.rule is not None:
            for name in plan.rule.state_kinds():
                write(plan.rule.state_key(name), state[RULE_STATE + name])
        return deltas

    def placed(self, split: Split) -> ClientData | None:
        """The `split` data on the engine's device (moved on first use; offsets stay on the CPU), or None on
        the CPU."""
        if self.device.type == "cpu":
            return None
        if split not in self._placed:
            data = self.split(split)
            self._placed[split] = ClientData(data.x.to(self.device), data.y.to(self.device), data.offsets)
        return self._placed[split]

    def split(self, split: Split) -> ClientData:
        """The clients' `split` data (on the CPU); the validation split only where the run has one."""
        data: ClientData | None = getattr(self.data, split)
        if data is None:
            raise ConfigError("this run has no validation split: set val_fraction (e.g. 0.1) to score one")
        return data

    def evaluated(self, params: Tensor) -> Tensor:
        """One model (P,) as it is scored: under the statistics policy ``recompute`` (docs/batchnorm.md), with its
        batch-norm statistics worked out afresh from every client's training data (the last model's kept)."""
        model = self.model
        if model.statistics != "recompute" or not model.stat_names:
            return params
        if self._recomputed is not None and torch.equal(self._recomputed[0], params):
            return self._recomputed[1]
        data = self.placed("train") or self.data.train
        with exact_float32(self.device):
            out = model.recompute_statistics(params.to(data.x.device), data.x).to(params.device)
        self._recomputed = (params.clone(), out)
        return out

    def scores(self, params: Tensor, split: Split = "test", clients: Tensor | None = None) -> ClientScores:
        """Loss and accuracy of one model on every client's `split` data, or only on `clients`' (the others
        NaN: not scored)."""
        params = self.evaluated(params)
        data: ClientData = self.placed(split) or self.split(split)
        with exact_float32(self.device):
            if clients is None:
                return score_clients(self.model, params, data)
            return scores_of_some(score_clients(self.model, params, data.select(clients)), clients, data.sizes)

    def losses_at(self, params: Tensor, clients: Tensor, split: Split = "train") -> Tensor:
        """F_k(w): the mean loss of model `params` on each of `clients`' full `split` data (m,)."""
        return score_clients(self.model, self.evaluated(params), self.split(split).select(clients)).loss

    def own_scores(self, params: Tensor, clients: Tensor, split: Split = "test") -> ClientScores:
        """Loss and accuracy of client i's own model params[i] on its own `split` data."""
        with exact_float32(self.device):
            return score_own_models(self.model, params, self.placed(split) or self.split(split), clients)

    def gradient_statistics(self, params: Tensor, clients: Tensor, samples: int, round_: int) -> tuple[Tensor, Tensor]:
        """Mean and per-coordinate variance (m, P) of `samples` per-sample gradients of each client at `params`
        (no dropout), from the round's "grad-stats" sample stream."""
        self.model.module.eval()
        return gradient_statistics(self.model, self.data.train, params, clients, samples, self.seed, round_)

    def sampled_losses(self, params: Tensor, clients: Tensor, batch: int, round_: int, stream: str) -> Tensor:
        """Each client's mean loss of `params` on `batch` of its training samples drawn from `stream` (m,)."""
        return sampled_losses(self.model, self.data.train, params, clients, batch, self.seed, round_, stream)

    def label_counts(self) -> Tensor:
        """(K, C) number of training samples of each class per client."""
        return label_counts(self.data)

    def reachable(self) -> Tensor:
        """(K,) bool: the clients the engine can still reach (all of them here; a remote engine loses the clients
        of a node that stops answering)."""
        return torch.ones(self.data.num_clients, dtype=torch.bool)

    def initial_params(self) -> Tensor:
        return self.model.initial_params()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep of the engine: the clients' state."""
        return {"client_state": self.client_state.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.client_state.load_state_dict(state.get("client_state", {}))


def label_counts(data: FederatedData) -> Tensor:
    """(K, C) number of training samples of each class per client."""
    counts = torch.zeros(data.num_clients, data.num_classes)
    counts.index_put_((data.train.owner, data.train.y), torch.ones(len(data.train.y)), accumulate=True)
    return counts


def _version(round_: int, phase: int) -> int:
    """The `ClientStore` version of what a plan of `phase` in round `round_` reads before and writes."""
    return round_ * PHASES + phase


def _namespace(plan: LocalPlan) -> Callable[[str], str]:
    """State keys of a plan: a personal plan keeps its terms', optimiser's and rule's state apart from the global
    training's (Ditto's personal steps do not share the momentum of its global ones)."""
    if plan.personal is None:
        return lambda key: key
    prefix = plan.personal.key
    return lambda key: f"{prefix}/{key}"


def _difference(new: Tensor, old: Tensor) -> Tensor:
    """new − old, computed into `old` (the cohort's rows as read, not needed after) unless `new` shares its memory."""
    if new.untyped_storage().data_ptr() == old.untyped_storage().data_ptr():
        return new - old
    return old.neg_().add_(new)


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """A per-client mask shaped to broadcast over rows of `like` (m, ...)."""
    return mask.view(-1, *([1] * (like.dim() - 1)))
