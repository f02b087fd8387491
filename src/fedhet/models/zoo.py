"""The models of the papers fedhet reproduces, as registered `ModelSpec` recipes.

Every model here is a plain `torch.nn.Module` that the engine can run functionally: with
`torch.func.functional_call` on parameters stacked over clients, under `torch.func.vmap` and
`torch.func.grad`. Hence no buffers updated in forward except batch norm's running statistics (the ResNets;
the engine carries them as model state, docs/batchnorm.md), no in-place operations on inputs,
no `.item()` and no Python control flow that depends on data values (loops over a sequence's fixed length are
fine). Inputs are flattened or reshaped inside the modules, so an image model accepts both ``(B, C, H, W)``
and ``(B, C*H*W)`` batches; every model returns logits of shape ``(B, num_classes)``.

Sources of the architectures:

* McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017
  (FedAvg): the MNIST "2NN" multilayer perceptron, the MNIST "CNN", the CIFAR-10 CNN and the Shakespeare
  character LSTM (also the LEAF benchmark's, Caldas et al. 2018).
* Cho, Jhunjhunwala, Li, Smith and Joshi, "Maximizing Global Model Appeal in Federated Learning" (MaxFL; the
  784-64-30 MLP with dropout after the first hidden layer).
* Hu, Shaloudegi, Zhang and Yu, "Federated Learning Meets Multi-objective Optimization" (FedMGDA+; the FedAvg
  CNN on MNIST).
* Rodio et al., "Federated Learning under Heterogeneous and Correlated Client Availability" (CA-Fed; linear
  models).
* FedGSNR (gradient signal-to-noise-ratio aware FL; LeNet-5 on CIFAR-10 after LeCun et al. 1998, VGG-16 on
  CIFAR-100 after Simonyan and Zisserman 2015).
* He, Zhang, Ren and Sun, "Deep Residual Learning for Image Recognition", CVPR 2016: ResNet-18 as torchvision
  builds it, adapted to 32×32 images (a 3×3 stem, no max-pool), and the CIFAR ResNet-8 (§4.2, n = 1), with batch
  norm (FedBN, Li et al. 2021; HeteroFL, Diao et al. 2021).
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import MODELS, ModelSpec, Statistics, batch_norm_field

PositiveInt = Annotated[int, Field(gt=0)]
Activation = Literal["relu", "tanh", "sigmoid", "gelu"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
}


def _features(input_shape: tuple[int, ...]) -> int:
    """The number of input features once a sample of `input_shape` is flattened."""
    if not input_shape or any(d <= 0 for d in input_shape):
        raise ConfigError(f"model: cannot build for input shape {input_shape}")
    return math.prod(input_shape)


def image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    """The ``(C, H, W)`` image a sample of `input_shape` holds.

    ``(C, H, W)`` is used as is and ``(H, W)`` gets one channel. A flat ``(n,)`` input is taken to be a square
    grey image when `n` is a square (784 → 1×28×28), else a square RGB image when `n / 3` is one
    (3072 → 3×32×32).
    """
    if len(input_shape) == 3:
        c, h, w = input_shape
        return c, h, w
    if len(input_shape) == 2:
        return 1, input_shape[0], input_shape[1]
    if len(input_shape) == 1:
        n = input_shape[0]
        for channels in (1, 3):
            side = math.isqrt(n // channels) if n % channels == 0 else 0
            if side > 0 and channels * side * side == n:
                return channels, side, side
    raise ConfigError(
        f"model '{model}' needs image inputs (C, H, W), (H, W) or a flat square image; got shape {input_shape}"
    )


class Flatten(nn.Module):
    """Flattens every sample: ``(B, *shape)`` → ``(B, prod(shape))`` (never in place)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1)


class ToImage(nn.Module):
    """Reshapes a batch to ``(B, C, H, W)``, whether it comes flat or already as images."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], *self.shape)


class ConvClassifier(nn.Module):
    """A convolutional feature extractor followed by a fully connected head, on (possibly flat) images."""

    def __init__(self, shape: tuple[int, int, int], features: nn.Sequential, head: nn.Sequential) -> None:
        super().__init__()
        self.to_image = ToImage(shape)
        self.features = features
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        z = self.features(self.to_image(x))
        return self.head(z.reshape(z.shape[0], -1))


def _flat_size(features: nn.Module, shape: tuple[int, int, int], model: str) -> int:
    """The number of features `features` outputs for one image of `shape` (found by a dry run)."""
    try:
        with torch.no_grad():
            return int(features(torch.zeros(1, *shape)).numel())
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"model '{model}': images of shape {shape} are too small for its layers") from err


@MODELS.register
class Logistic(ModelSpec):
    """Multinomial logistic regression: one linear layer over the flattened input.

    The convex baseline of the papers' synthetic and MNIST experiments (e.g. CA-Fed, FedMGDA+); with a squared
    loss the same layer serves for linear regression.
    """

    name: ClassVar[str] = "logistic"
    description: ClassVar[str] = "Multinomial logistic regression (one linear layer on the flattened input)."

    bias: bool = True

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return nn.Sequential(Flatten(), nn.Linear(_features(input_shape), num_classes, bias=self.bias))


@MODELS.register
class MLP(ModelSpec):
    """A multilayer perceptron on the flattened input.

    ``hidden=[200, 200]`` is FedAvg's MNIST "2NN" (McMahan et al. 2017, 199,210 parameters);
    ``hidden=[64, 30]`` with ``dropout`` after the first hidden layer is MaxFL's MLP (Cho et al.). Dropout
    follows the activation of the first hidden layer only (``dropout_after="first"``) or of every hidden layer
    (``"all"``); the engine draws its masks. An empty `hidden` gives logistic regression.
    """

    name: ClassVar[str] = "mlp"
    description: ClassVar[str] = "Multilayer perceptron on the flattened input (FedAvg 2NN, MaxFL MLP)."

    hidden: list[PositiveInt] = Field(default_factory=lambda: [200])
    activation: Activation = "relu"
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    dropout_after: Literal["first", "all"] = "first"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        layers: list[nn.Module] = [Flatten()]
        width = _features(input_shape)
        for i, h in enumerate(self.hidden):
            layers += [nn.Linear(width, h), _ACTIVATIONS[self.activation]()]
            if self.dropout > 0 and (i == 0 or self.dropout_after == "all"):
                layers.append(nn.Dropout(self.dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        return nn.Sequential(*layers)


@MODELS.register
class CNNMnist(ModelSpec):
    """The FedAvg CNN for 28×28 grey images (McMahan et al. 2017), also used by FedMGDA+ (Hu et al.).

    conv 5×5 (32) → ReLU → max-pool 2 → conv 5×5 (64) → ReLU → max-pool 2 → fc `hidden` → ReLU → fc C.
    With ``padding="same"`` (2 pixels, the default) it has the paper's 1,663,370 parameters on MNIST;
    ``"valid"`` (no padding) gives the smaller 582,026-parameter variant. A flat (784,) input is reshaped to
    1×28×28; the head's input size is inferred from the input shape.
    """

    name: ClassVar[str] = "cnn_mnist"
    description: ClassVar[str] = "FedAvg's MNIST CNN: two 5x5 conv + max-pool layers, fc 512, fc C."

    channels: tuple[PositiveInt, PositiveInt] = (32, 64)
    hidden: PositiveInt = 512
    padding: Literal["same", "valid"] = "same"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        pad = 2 if self.padding == "same" else 0
        c1, c2 = self.channels
        features = nn.Sequential(
            nn.Conv2d(shape[0], c1, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(nn.Linear(flat, self.hidden), nn.ReLU(), nn.Linear(self.hidden, num_classes))
        return ConvClassifier(shape, features, head)


@MODELS.register
class LeNetCifar(ModelSpec):
    """LeNet-5 for 3×32×32 images (LeCun et al. 1998), FedGSNR's CIFAR-10 model.

    conv 5×5 (6) → ReLU → max-pool 2 → conv 5×5 (16) → ReLU → max-pool 2 → fc 120 → ReLU → fc 84 → ReLU →
    fc C, without padding: 62,006 parameters for CIFAR-10.
    """

    name: ClassVar[str] = "lenet_cifar"
    description: ClassVar[str] = "LeNet-5 for 32x32 colour images (FedGSNR's CIFAR-10 model)."

    channels: tuple[PositiveInt, PositiveInt] = (6, 16)
    hidden: tuple[PositiveInt, PositiveInt] = (120, 84)

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        c1, c2 = self.channels
        h1, h2 = self.hidden
        features = nn.Sequential(
            nn.Conv2d(shape[0], c1, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(nn.Linear(flat, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, num_classes))
        return ConvClassifier(shape, features, head)


@MODELS.register
class VGG16(ModelSpec):
    """VGG-16 (Simonyan & Zisserman 2015, configuration D) for small colour images, FedGSNR's CIFAR-100 model.

    Five stages of 3×3 'same' convolutions (2, 2, 3, 3, 3 of them; `widths` channels, default 64, 128, 256,
    512, 512), each conv followed by ReLU and each stage by max-pool 2, then fc 512 → ReLU → fc 512 → ReLU →
    fc C (the usual CIFAR head): 15,291,300 parameters for CIFAR-100, 15,299,748 with GroupNorm. BatchNorm
    updates buffers in the forward pass, which the functional engine cannot do, so `norm` is GroupNorm
    (gcd(32, channels) groups after every conv; a per-sample statistic, safe for per-sample gradients) or none
    (gradients then vanish through the 13 plain layers at PyTorch's default initialisation). The FedGSNR paper
    does not say which.
    """

    name: ClassVar[str] = "vgg16"
    description: ClassVar[str] = "VGG-16 (config D) with GroupNorm or no norm, CIFAR head (FedGSNR's CIFAR-100 model)"

    widths: tuple[PositiveInt, PositiveInt, PositiveInt, PositiveInt, PositiveInt] = (64, 128, 256, 512, 512)
    hidden: PositiveInt = 512
    norm: Literal["group", "none"] = "group"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        layers: list[nn.Module] = []
        channels = shape[0]
        for width, convs in zip(self.widths, (2, 2, 3, 3, 3), strict=True):
            for _ in range(convs):
                layers.append(nn.Conv2d(channels, width, 3, padding=1))
                if self.norm == "group":
                    layers.append(nn.GroupNorm(math.gcd(32, width), width))
                layers.append(nn.ReLU())
                channels = width
            layers.append(nn.MaxPool2d(2))
        features = nn.Sequential(*layers)
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(
            nn.Linear(flat, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, num_classes),
        )
        return ConvClassifier(shape, features, head)


@MODELS.register
class CNNCifar(ModelSpec):
    """A FedAvg-style CNN for 3×32×32 images (after McMahan et al. 2017).

    conv 5×5 (32) → ReLU → max-pool 2 → conv 5×5 (64) → ReLU → max-pool 2 → fc `hidden` → ReLU → fc C. Both
    convolutions pad by 2 pixels ('same' padding), so the head sees 64×8×8 features: 2,156,490 parameters on
    CIFAR-10. This is the MNIST CNN's layout applied to colour images, as common FedAvg reimplementations do;
    the paper's own CIFAR model (the TensorFlow tutorial network, with local response normalisation and
    fc 384/192) is a different network.
    """

    name: ClassVar[str] = "cnn_cifar"
    description: ClassVar[str] = "FedAvg-style CIFAR CNN: two 5x5 'same' conv + max-pool layers, fc 512, fc C."

    channels: tuple[PositiveInt, PositiveInt] = (32, 64)
    hidden: PositiveInt = 512

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        c1, c2 = self.channels
        features = nn.Sequential(
            nn.Conv2d(shape[0], c1, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(nn.Linear(flat, self.hidden), nn.ReLU(), nn.Linear(self.hidden, num_classes))
        return ConvClassifier(shape, features, head)


def inside_vmap() -> bool:
    """Whether the caller runs under `torch.func.vmap` (at any depth of torch.func transforms); True when this
    torch does not say, so that callers keep their vmap-safe path."""
    try:
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:  # pragma: no cover - a torch without these private helpers
        return True
    return any(i.key() == TransformType.Vmap for i in retrieve_all_functorch_interpreters())


class LoopLSTM(nn.Module):
    """A stacked, batch-first LSTM written out step by step with plain tensor operations under `torch.func.vmap`,
    torch's fused LSTM kernel elsewhere.

    It computes what ``torch.nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)`` computes from a
    zero initial state, with the same parameters: named ``weight_ih_l{k}``, ``weight_hh_l{k}``,
    ``bias_ih_l{k}``, ``bias_hh_l{k}``, in the same order, with gates (i, f, g, o) stacked the same way and
    initialised the same way. So a flat parameter vector (or state dict) means the same in both. `nn.LSTM`'s
    fused kernel has no vmap batching rule (vmap falls back to a per-client loop with a warning), while every
    operation of the written-out loop is batched natively over clients; outside vmap (the `sequential` backend,
    evaluation) the fused kernel is faster per training step on a CPU (docs/performance.md, "The Shakespeare
    LSTM"), so it is used there, on the same parameters.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        for k in range(num_layers):
            width = input_size if k == 0 else hidden_size
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size, width)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size, hidden_size)))
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
        bound = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():  # as nn.LSTM.reset_parameters, in the same order
            nn.init.uniform_(p, -bound, bound)

    def _layer(self, x: Tensor, k: int) -> Tensor:
        weight_ih: Tensor = getattr(self, f"weight_ih_l{k}")
        weight_hh: Tensor = getattr(self, f"weight_hh_l{k}")
        bias: Tensor = getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}")
        size = self.hidden_size
        steps = F.linear(x, weight_ih, bias).unbind(1)  # input projections of all time steps at once
        weight_hh_t = weight_hh.t()
        h = torch.zeros(x.shape[0], size, dtype=x.dtype, device=x.device)
        c = torch.zeros_like(h)
        outputs = []
        for projected in steps:  # a fixed number of steps: no data-dependent control flow
            gates = projected + h @ weight_hh_t
            i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
            g = torch.tanh(gates[:, 2 * size : 3 * size])
            c = f * c + i * g
            h = o * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, L, input_size)`` → the last layer's hidden states ``(B, L, hidden_size)``."""
        if not inside_vmap():
            h0 = x.new_zeros(self.num_layers, x.shape[0], self.hidden_size)
            names = ("weight_ih_l", "weight_hh_l", "bias_ih_l", "bias_hh_l")
            weights: list[Tensor] = [getattr(self, f"{n}{k}") for k in range(self.num_layers) for n in names]
            return torch.lstm(x, (h0, h0), weights, True, self.num_layers, 0.0, self.training, False, True)[0]
        for k in range(self.num_layers):
            x = self._layer(x, k)
        return x


class FusedLSTM(nn.LSTM):
    """`torch.nn.LSTM` (batch-first, zero initial state) returning only the last layer's hidden states."""

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return super().forward(x)[0]


class CharLSTMNet(nn.Module):
    """Embedding → stacked LSTM → linear read-out of the last time step's hidden state."""

    def __init__(self, vocab: int, embed_dim: int, hidden: int, layers: int, fused: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.lstm: nn.Module = (
            FusedLSTM(embed_dim, hidden, layers, batch_first=True) if fused else LoopLSTM(embed_dim, hidden, layers)
        )
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.lstm(self.embedding(x))[:, -1])


@MODELS.register
class CharLSTM(ModelSpec):
    """The Shakespeare next-character LSTM (McMahan et al. 2017; LEAF, Caldas et al. 2018).

    Embedding (vocabulary = `num_classes`, `embed_dim` 8) → `layers` (2) LSTM layers of `hidden` (256) units →
    linear layer to `num_classes` logits from the last time step; inputs are int64 tokens ``(B, L)``.
    By default the LSTM is `LoopLSTM`: written out step by step under `torch.func.vmap`, which then batches it
    over clients natively, and torch's fused kernel elsewhere. ``fused=True`` uses `torch.nn.LSTM` always, with
    the same parameter vector and results; under vmap its kernel runs once per client (a batching-rule fallback
    PyTorch warns about), which is slower on a CPU (docs/performance.md, "The Shakespeare LSTM").
    """

    name: ClassVar[str] = "char_lstm"
    description: ClassVar[str] = "Character LSTM for Shakespeare (embedding 8, 2x LSTM 256, last-step read-out)."

    embed_dim: PositiveInt = 8
    hidden: PositiveInt = 256
    layers: PositiveInt = 2
    fused: bool = False

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if len(input_shape) != 1:
            raise ConfigError(f"model '{self.name}' needs token sequences (L,); got input shape {input_shape}")
        return CharLSTMNet(num_classes, self.embed_dim, self.hidden, self.layers, self.fused)


def _norm(kind: Literal["batch", "group"], channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if kind == "batch" else nn.GroupNorm(math.gcd(32, channels), channels)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: conv 3×3 → norm → ReLU → conv 3×3 → norm, plus the input (through a 1×1
    conv and norm where the stride or width changes), → ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: Literal["batch", "group"]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = _norm(norm, c_out)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _norm(norm, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.downsample(x))


class ResNetNet(nn.Module):
    """Stem conv 3×3 → norm → ReLU, stages of BasicBlocks (the first at stride 1, the others halving the size),
    global average pooling, a linear classifier; the state dict's names are torchvision's (``layer2.0.bn1``)."""

    def __init__(
        self,
        shape: tuple[int, int, int],
        blocks: tuple[int, ...],
        widths: tuple[int, ...],
        num_classes: int,
        norm: Literal["batch", "group"],
    ) -> None:
        super().__init__()
        self.to_image = ToImage(shape)
        self.conv1 = nn.Conv2d(shape[0], widths[0], 3, padding=1, bias=False)
        self.bn1 = _norm(norm, widths[0])
        c_in = widths[0]
        self.stages = len(blocks)
        for i, (count, width) in enumerate(zip(blocks, widths, strict=True)):  # torchvision's names: layer1, ...
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(c_in if j == 0 else width, width, stride if j == 0 else 1, norm) for j in range(count)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*stage))
            c_in = width
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        z = F.relu(self.bn1(self.conv1(self.to_image(x))))
        for i in range(self.stages):
            z = getattr(self, f"layer{i + 1}")(z)
        return self.fc(z.mean(dim=(2, 3)))


class _ResNet(ModelSpec):
    """A ResNet of BasicBlocks for small images; `width` scales every stage's channels."""

    blocks: ClassVar[tuple[int, ...]]
    widths: ClassVar[tuple[int, ...]]
    width: PositiveInt = Field(..., description="the first stage's channels (the others double at each stage)")
    norm: Literal["batch", "group"] = Field("batch", description="BatchNorm2d, or GroupNorm(gcd(32, channels))")
    batch_norm: Statistics | None = batch_norm_field()

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        widths = tuple(self.width * w // self.widths[0] for w in self.widths)
        return ResNetNet(shape, self.blocks, widths, num_classes, self.norm)


@MODELS.register
class ResNet18(_ResNet):
    """ResNet-18 (He et al. 2016) as torchvision builds it, for 32×32 images: a 3×3 stem conv (64) without max-pool,
    four stages of two BasicBlocks (64, 128, 256, 512 channels; strides 1, 2, 2, 2), BatchNorm2d after every conv,
    global average pooling, fc C: 11,173,962 parameters for CIFAR-10. ``width`` 16 gives a 700k-parameter one."""

    name: ClassVar[str] = "resnet18"
    description: ClassVar[str] = "ResNet-18 for 32x32 images (3x3 stem, no max-pool), BatchNorm2d; width option"
    blocks: ClassVar[tuple[int, ...]] = (2, 2, 2, 2)
    widths: ClassVar[tuple[int, ...]] = (64, 128, 256, 512)
    width: PositiveInt = Field(64, description="the first stage's channels (64: ResNet-18; the others double)")


@MODELS.register
class ResNet8(_ResNet):
    """The CIFAR ResNet-8 (He et al. 2016, §4.2 with n = 1): a 3×3 stem conv (16), three stages of one BasicBlock
    (16, 32, 64 channels; strides 1, 2, 2), BatchNorm2d, global average pooling, fc C: 78,042 parameters for
    CIFAR-10 (a 1×1 conv shortcut where the width changes)."""

    name: ClassVar[str] = "resnet8"
    description: ClassVar[str] = "CIFAR ResNet-8 (16-32-64 channels, one BasicBlock a stage), BatchNorm2d"
    blocks: ClassVar[tuple[int, ...]] = (1, 1, 1)
    widths: ClassVar[tuple[int, ...]] = (16, 32, 64)
    width: PositiveInt = Field(16, description="the first stage's channels (16: ResNet-8; the others double)")
