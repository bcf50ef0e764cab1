"""Two models for extra/bench.py, each written once with lazygrad's (and tinygrad's) layers and once as a torch
function of the same parameters, named as lazygrad's state dict names them: a torch step can start from
lazygrad's weights, and lazygrad's loss can be checked against torch's.

- a small transformer (2 blocks, width 128, 4 heads, feed-forward 32, sequence 6, 10 symbols), as tinygrad's
  users train it: token and position embeddings, post-norm blocks, a linear head;
- ResNet18 in the torchvision layout (3x3 convolutions, batch norm, a 7x7 stride-2 stem and max pool), for
  32x32 images and 10 classes.
"""

from __future__ import annotations

from typing import Any

TRANSFORMER = {"batch": 64, "time": 6, "width": 128, "heads": 4, "feed_forward": 32, "symbols": 10, "blocks": 2}
RESNET_STAGES = (64, 128, 256, 512)


class TransformerBlock:
    def __init__(self, nn: Any, width: int, feed_forward: int, heads: int):
        self.heads = heads
        self.query, self.key, self.value, self.out = [nn.Linear(width, width) for _ in range(4)]
        self.up, self.down = nn.Linear(width, feed_forward), nn.Linear(feed_forward, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)

    def __call__(self, x: Any) -> Any:
        batch, time, width = x.shape
        q, k, v = [
            layer(x).reshape(batch, time, self.heads, width // self.heads).transpose(1, 2)
            for layer in (self.query, self.key, self.value)
        ]
        attention = (q @ k.transpose(2, 3) / (width // self.heads) ** 0.5).softmax(-1) @ v
        x = self.norm1(x + self.out(attention.transpose(1, 2).reshape(batch, time, width)))
        return self.norm2(x + self.down(self.up(x).relu()))


class Transformer:
    """The small transformer, built with `library`'s Tensor and nn (lazygrad or tinygrad)."""

    def __init__(self, library: Any):
        shape = TRANSFORMER
        self.embedding = library.nn.Embedding(shape["symbols"], shape["width"])
        self.position = library.Tensor.uniform(shape["time"], shape["width"], low=-0.1, high=0.1)
        self.blocks = [
            TransformerBlock(library.nn, shape["width"], shape["feed_forward"], shape["heads"])
            for _ in range(shape["blocks"])
        ]
        self.head = library.nn.Linear(shape["width"], shape["symbols"])

    def __call__(self, tokens: Any) -> Any:
        x = self.embedding(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def torch_transformer(p: dict[str, Any], tokens: Any) -> Any:
    """The transformer's logits in torch, from parameters named as in lazygrad's state dict."""
    import torch.nn.functional as F

    shape = TRANSFORMER
    heads, width = shape["heads"], shape["width"]

    def linear(name, x):
        return F.linear(x, p[f"{name}.weight"], p[f"{name}.bias"])

    def norm(name, x):
        return F.layer_norm(x, (width,), p[f"{name}.weight"], p[f"{name}.bias"])

    x = F.embedding(tokens, p["embedding.weight"]) + p["position"]
    batch, time, _ = x.shape
    for number in range(shape["blocks"]):
        block = f"blocks.{number}"
        q, k, v = [
            linear(f"{block}.{name}", x).reshape(batch, time, heads, width // heads).transpose(1, 2)
            for name in ("query", "key", "value")
        ]
        attention = (q @ k.transpose(2, 3) / (width // heads) ** 0.5).softmax(-1) @ v
        x = norm(f"{block}.norm1", x + linear(f"{block}.out", attention.transpose(1, 2).reshape(batch, time, width)))
        x = norm(f"{block}.norm2", x + linear(f"{block}.down", linear(f"{block}.up", x).relu()))
    return linear("head", x)


class BasicBlock:
    def __init__(self, nn: Any, channels_in: int, channels: int, stride: int):
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = []
        if stride != 1 or channels_in != channels:
            self.downsample = [nn.Conv2d(channels_in, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)]

    def __call__(self, x: Any) -> Any:
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        shortcut = self.downsample[1](self.downsample[0](x)) if self.downsample else x
        return (out + shortcut).relu()


class ResNet18:
    """ResNet18 for 32x32 images, built with `library`'s nn (lazygrad or tinygrad)."""

    def __init__(self, library: Any, classes: int = 10):
        nn = library.nn
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
        self.layers, channels_in = [], 64
        for stage, channels in enumerate(RESNET_STAGES):
            stride = 1 if stage == 0 else 2
            self.layers += [BasicBlock(nn, channels_in, channels, stride), BasicBlock(nn, channels, channels, 1)]
            channels_in = channels
        self.fc = nn.Linear(RESNET_STAGES[-1], classes)

    def __call__(self, x: Any) -> Any:
        x = self.bn1(self.conv1(x)).relu().max_pool2d(kernel_size=(3, 3), stride=2, padding=1)
        for layer in self.layers:
            x = layer(x)
        return self.fc(x.mean(axis=(2, 3)))


def torch_resnet18(p: dict[str, Any], x: Any, buffers: dict[str, Any]) -> Any:
    """ResNet18's logits in torch (batch norm in training mode, updating the running statistics in `buffers`),
    from parameters named as in lazygrad's state dict."""
    import torch.nn.functional as F

    def norm(name, x):
        return F.batch_norm(
            x, buffers[f"{name}.running_mean"], buffers[f"{name}.running_var"], p[f"{name}.weight"],
            p[f"{name}.bias"], training=True,
        )  # fmt: skip

    x = F.conv2d(x, p["conv1.weight"], stride=2, padding=3)
    x = F.max_pool2d(norm("bn1", x).relu(), 3, stride=2, padding=1)
    for number in range(2 * len(RESNET_STAGES)):
        block = f"layers.{number}"
        stride = 2 if number % 2 == 0 and number > 0 else 1
        out = F.conv2d(x, p[f"{block}.conv1.weight"], stride=stride, padding=1)
        out = norm(f"{block}.bn2", F.conv2d(norm(f"{block}.bn1", out).relu(), p[f"{block}.conv2.weight"], padding=1))
        if f"{block}.downsample.0.weight" in p:
            x = norm(f"{block}.downsample.1", F.conv2d(x, p[f"{block}.downsample.0.weight"], stride=stride))
        x = (out + x).relu()
    return F.linear(x.mean(dim=(2, 3)), p["fc.weight"], p["fc.bias"])
