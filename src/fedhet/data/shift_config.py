"""The config's ``shift`` and the shift registry (`SHIFTS`), apart from the code that shifts the clients' data
(`fedhet.data.shift`, `fedhet.data.shift_transforms`), so that the config validates without importing torch.

A shift is a registered component (`ShiftComponent`): each client is put in one of ``groups`` ground-truth groups
(clients.csv's ``group``), and `ShiftComponent.transform` changes the samples of each group, after any label
partition. A plugin adds one with ``@SHIFTS.register`` (docs/extending.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from fedhet.registry import Component, Registry, Settings

if TYPE_CHECKING:  # torch only where data is shifted
    import numpy as np

    from fedhet.data.dataset import ClientData, Dataset
    from fedhet.data.partition import Partitioner
    from fedhet.data.shift_transforms import Assignment

ROTATIONS = 4  # k·90°, k = 0..3: the distinct exact rotations of a square image
MAX_GROUPS = 64


class Groups(Settings):
    """The keys every shift has: how many ground-truth groups, and how clients are put in them."""

    groups: int = Field(4, ge=1, le=MAX_GROUPS, description="G: the number of ground-truth groups")
    assign: Literal["cyclic", "random"] = Field(
        "cyclic", description="client k in group k mod G (cyclic), or that balanced assignment seeded-shuffled"
    )


class ShiftComponent(Component, Groups):
    """A shift of the clients' data per ground-truth group (a registered component, `SHIFTS`).

    `transform` gets one split's data (train, test or validation: all of them are shifted alike) and the clients'
    groups and levels (`fedhet.data.shift_transforms.Assignment`), and returns the shifted data: the same offsets,
    new inputs and/or labels. `group_levels` gives each group's level (an angle, a noise std, ...; None: the shift
    has none), written to clients.csv as ``shift_level``.
    """

    active: ClassVar[bool] = True
    level_name: ClassVar[str] = ""  # what `group_levels` measures, e.g. "noise std" (empty: no level)

    def group_levels(self) -> list[float] | None:
        """Each group's level (G,), or None."""
        return None

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        """`part` shifted: the samples of client k by its group ``who.groups[k]`` (and level ``who.levels[k]``)."""
        raise NotImplementedError(f"shift '{self.name}' has no transform")

    def for_dataset(self, dataset: Dataset) -> ShiftComponent:
        """This shift as it applies to `dataset` (default: as it is; ``domain`` takes the data's domains)."""
        del dataset
        return self

    def partitioner(self, partitioner: Partitioner, groups: np.ndarray) -> Partitioner:
        """The partitioner that splits the samples among the clients, given each client's group (default: the run's;
        ``domain`` splits each domain among its group's clients)."""
        del groups
        return partitioner


SHIFTS: Registry[ShiftComponent] = Registry("shift")


@SHIFTS.register
class NoShift(ShiftComponent):
    name: ClassVar[str] = "none"
    description: ClassVar[str] = "no shift: every client's data as the partition made it (no groups)"
    active: ClassVar[bool] = False


@SHIFTS.register
class Rotation(ShiftComponent):
    """Feature shift: each image of group g rotated by g·90° (`torch.rot90`: exact, a permutation of the pixels);
    square images, or flat s² features such as digits' 8×8; at most 4 groups."""

    name: ClassVar[str] = "rotation"
    description: ClassVar[str] = "feature shift: group g's images rotated by g·90° (at most 4 groups)"
    level_name: ClassVar[str] = "degrees"

    @model_validator(mode="after")
    def _fits(self) -> Rotation:
        if self.groups > ROTATIONS:
            raise ValueError(f"rotation has {ROTATIONS} distinct angles (k·90°): give groups ≤ {ROTATIONS}")
        return self

    def group_levels(self) -> list[float]:
        return [90.0 * g for g in range(self.groups)]

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import rotate

        return rotate(part, who)


@SHIFTS.register
class Labels(ShiftComponent):
    """Concept shift, on any classification dataset and partition: the labels of group g ≥ 1 are mapped by a seeded
    table of its own, the identity for group 0: a permutation of the classes (``mode: permute``), or `pairs`
    disjoint random label pairs swapped (``mode: swap``, as the ``swapped_groups`` dataset does)."""

    name: ClassVar[str] = "labels"
    description: ClassVar[str] = "concept shift: a seeded label permutation (or label-pair swaps) per group"
    mode: Literal["permute", "swap"] = Field("permute", description="permute the classes, or swap `pairs` pairs")
    pairs: int = Field(2, ge=1, le=1000, description="label pairs swapped in each group g ≥ 1 (mode swap)")

    @model_serializer(mode="wrap")
    def _as_before_swaps(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """config.yaml (and the run's identity) as before ``mode`` existed, for a permutation."""
        data: dict[str, Any] = handler(self)
        if self.mode == "permute":
            data.pop("mode", None)
            data.pop("pairs", None)
        return data

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import permute_labels, swap_labels

        return permute_labels(part, who) if self.mode == "permute" else swap_labels(part, who, self.pairs)


class LevelShift(ShiftComponent):
    """A feature shift with a level per group: evenly spaced from 0 (group 0, unshifted) to `strength` (group G−1),
    or the `levels` listed; with `per_client`, each client draws its own level uniformly in [0, strength] (seeded),
    and its group is the nearest of the G evenly spaced levels."""

    strength: float = Field(1.0, ge=0, le=1000, description="the level of the last group")
    levels: list[float] | None = Field(None, description="each group's level, G values (instead of 0..strength)")
    per_client: bool = Field(False, description="a level per client, uniform in [0, strength]")
    limit: ClassVar[float] = 1000.0  # the largest level that makes sense

    @model_validator(mode="after")
    def _levels_fit(self) -> LevelShift:
        if self.levels is not None:
            if len(self.levels) != self.groups:
                raise ValueError(f"levels lists {len(self.levels)} values for {self.groups} groups")
            if self.per_client:
                raise ValueError("levels are per group; per_client draws a level per client: give one of them")
        if min(self.levels or [0.0]) < 0 or max(self.levels or [self.strength]) > self.limit:
            raise ValueError(f"a {self.level_name} must be within [0, {self.limit:g}]")
        return self

    def group_levels(self) -> list[float]:
        if self.levels is not None:
            return list(self.levels)
        return [self.strength * g / max(self.groups - 1, 1) for g in range(self.groups)]


@SHIFTS.register
class Noise(LevelShift):
    """Feature shift: Gaussian noise of std σ_g (the group's level) added to every input (any float features)."""

    name: ClassVar[str] = "noise"
    description: ClassVar[str] = "feature shift: Gaussian noise of a std per group added to the inputs"
    level_name: ClassVar[str] = "noise std"

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import add_noise

        return add_noise(part, who)


@SHIFTS.register
class Blur(LevelShift):
    """Feature shift: each image blurred by a Gaussian of std σ_g pixels (the group's level; 0: unchanged), a
    separable convolution over a (2⌈3σ⌉+1)² window with the edge pixels repeated."""

    name: ClassVar[str] = "blur"
    description: ClassVar[str] = "feature shift: Gaussian blur of a sigma (pixels) per group"
    level_name: ClassVar[str] = "blur sigma"
    limit: ClassVar[float] = 64.0

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import blur

        return blur(part, who)


@SHIFTS.register
class Contrast(LevelShift):
    """Feature shift: each image's contrast lowered by the group's level c ∈ [0, 1]: x' = μ + (1 − c)(x − μ), μ the
    image's mean per channel (c = 1: a flat image)."""

    name: ClassVar[str] = "contrast"
    description: ClassVar[str] = "feature shift: image contrast lowered by a level in [0, 1] per group"
    level_name: ClassVar[str] = "contrast loss"
    limit: ClassVar[float] = 1.0
    strength: float = Field(0.8, ge=0, le=1, description="the level of the last group")

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import contrast

        return contrast(part, who)


@SHIFTS.register
class Colour(LevelShift):
    """Feature shift: a brightness/colour cast per group: x'_c = x_c + b_g d_{g,c}, b_g the group's level and d_g a
    seeded direction in [−1, 1]^C over the image's C channels (one channel: a brightness change of ±b_g)."""

    name: ClassVar[str] = "colour"
    description: ClassVar[str] = "feature shift: a seeded brightness/colour cast of a level per group"
    level_name: ClassVar[str] = "colour cast"

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        from fedhet.data.shift_transforms import colour

        return colour(part, who)


@SHIFTS.register
class Domain(ShiftComponent):
    """Domains as groups: a dataset whose samples belong to domains (``image_domains``, a folder per domain, or any
    dataset with users) gives each client the data of one domain, group = domain (client k in domain k mod D, or
    shuffled: ``assign``); the run's partition splits each domain's samples among that domain's clients."""

    name: ClassVar[str] = "domain"
    description: ClassVar[str] = "each client's data from one domain of the dataset (group = domain)"
    groups: int | None = Field(  # type: ignore[assignment]  # None until the dataset says how many
        None, ge=1, le=MAX_GROUPS, description="the dataset's number of domains (default)"
    )

    def for_dataset(self, dataset: Dataset) -> ShiftComponent:
        from fedhet.errors import DataError

        if dataset.users is None:
            raise DataError(
                f"shift 'domain' takes each client's data from one domain, and '{dataset.name}' has no domains; use "
                "dataset image_domains (a folder per domain) or another shift"
            )
        count = int(dataset.users.max()) + 1
        if self.groups is not None and self.groups != count:
            raise DataError(f"shift.groups ({self.groups}) is not the dataset's {count} domains; leave groups out")
        if count > MAX_GROUPS:
            raise DataError(f"shift 'domain': the dataset has {count} domains, more than {MAX_GROUPS}")
        return self.model_copy(update={"groups": count})

    def partitioner(self, partitioner: Partitioner, groups: np.ndarray) -> Partitioner:
        from fedhet.data.shift_transforms import ByDomain

        return ByDomain(inner=partitioner, groups=tuple(groups.tolist()))

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        return part


class Shift(Groups):
    """The config's ``shift``: a registered shift's name (`SHIFTS`, ``fedhet list shifts``) and its parameters.

    ``rotation``: each image of group g is rotated by g·90° (feature shift; at most 4 groups).
    ``labels``: the labels of group g are permuted by a seeded permutation of the classes, the identity for group 0
    (concept shift: the same image means a different class in each group). ``noise``, ``blur``, ``contrast``,
    ``colour``: a feature shift of a level per group; ``domain``: a domain per group (docs/shift.md).
    """

    model_config = ConfigDict(extra="allow")
    name: str = Field("none", description="a shift (fedhet list shifts): none, rotation, labels, noise, blur, ...")

    @model_serializer(mode="wrap")
    def _name_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {"name": data.pop("name"), **data} if "name" in data else data

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _valid(self) -> Shift:
        """A built-in shift (or a plugin's already imported) checked now; another name when its plugin is imported."""
        if self.name in SHIFTS.names():
            self.component()
        return self

    def spec(self) -> dict[str, Any]:
        """``{name, **the parameters given}`` (a parameter left out takes the shift's own default)."""
        given = self.model_dump(exclude_unset=True)
        return {**given, "name": self.name}

    def component(self) -> ShiftComponent:
        """The registered shift this names, built (a one-line `ConfigError` for an unknown name or parameter)."""
        return SHIFTS.build(self.spec(), where="shift")

    @property
    def active(self) -> bool:
        return self.name != "none"
