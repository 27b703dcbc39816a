"""Model zoo: torch.nn modules with fixed-seed random weights (nothing is downloaded).

resnet18, resnet50, mobilenet_v2, inception_v3, regnet_x_400mf and the video ResNet-18 r3d_18
(every conv 3D; a 16-frame 112x112 clip): the torchvision architectures, written here; a
BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, seq 128; its input is the
embedding output [1, 128, 768]) and ViT-B/16 (the same encoder over 197 tokens); two speech
encoders, convolutions over time in front of torch's own transformer layers (zoo_speech.py:
Whisper tiny's, 3000 mel frames, and wav2vec 2.0 base, one second of audio). Batch norms
get random running statistics so that folding them is exercised, and weights are scaled to
keep activations in a sane range.
"""

import torch
from torch import nn

from .zoo_speech import Wav2Vec2, WhisperEncoder


def _bn(c, dims=2):
    return (nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d)(c)


def _conv(dims):
    return nn.Conv2d if dims == 2 else nn.Conv3d


def _downsample(cin, out, stride, dims=2):
    """The projection shortcut of a residual block (1x1 conv + bn), or None for identity."""
    if stride == 1 and cin == out:
        return None
    return nn.Sequential(_conv(dims)(cin, out, 1, stride, bias=False), _bn(out, dims))


class BasicBlock(nn.Module):
    """ResNet's basic block; dims=3: every conv 3D (torchvision's video ResNet block)."""

    expansion = 1

    def __init__(self, cin, c, stride=1, dims=2):
        super().__init__()
        self.conv1 = _conv(dims)(cin, c, 3, stride, 1, bias=False)
        self.bn1 = _bn(c, dims)
        self.conv2 = _conv(dims)(c, c, 3, 1, 1, bias=False)
        self.bn2 = _bn(c, dims)
        self.down = _downsample(cin, c, stride, dims)

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, c, stride=1):
        super().__init__()
        out = c * 4
        self.conv1 = nn.Conv2d(cin, c, 1, bias=False)
        self.bn1 = _bn(c)
        self.conv2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.bn2 = _bn(c)
        self.conv3 = nn.Conv2d(c, out, 1, bias=False)
        self.bn3 = _bn(out)
        self.down = _downsample(cin, out, stride)

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), _bn(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            c = 64 * 2 ** i
            for j in range(n):
                blocks.append(block(cin, c, 2 if (j == 0 and i > 0) else 1))
                cin = c * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), _bn(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), _bn(hidden),
                   nn.ReLU6(), nn.Conv2d(hidden, cout, 1, bias=False), _bn(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), _bn(32), nn.ReLU6()]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), _bn(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        y = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(torch.flatten(y, 1))


class BasicConv(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, padding=0):
        super().__init__(nn.Conv2d(cin, cout, k, stride, padding, bias=False), _bn(cout), nn.ReLU())


class InceptionA(nn.Module):
    def __init__(self, cin, pool):
        super().__init__()
        self.b1 = BasicConv(cin, 64, 1)
        self.b5 = nn.Sequential(BasicConv(cin, 48, 1), BasicConv(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(BasicConv(cin, 64, 1), BasicConv(64, 96, 3, padding=1),
                                BasicConv(96, 96, 3, padding=1))
        self.bp = BasicConv(cin, pool, 1)

    def forward(self, x):
        p = self.bp(nn.functional.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), p], 1)


class InceptionB(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.b3 = BasicConv(cin, 384, 3, stride=2)
        self.bd = nn.Sequential(BasicConv(cin, 64, 1), BasicConv(64, 96, 3, padding=1),
                                BasicConv(96, 96, 3, stride=2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.bd(x), nn.functional.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin, c7):
        super().__init__()
        self.b1 = BasicConv(cin, 192, 1)
        self.b7 = nn.Sequential(BasicConv(cin, c7, 1), BasicConv(c7, c7, (1, 7), padding=(0, 3)),
                                BasicConv(c7, 192, (7, 1), padding=(3, 0)))
        self.bd = nn.Sequential(BasicConv(cin, c7, 1), BasicConv(c7, c7, (7, 1), padding=(3, 0)),
                                BasicConv(c7, c7, (1, 7), padding=(0, 3)),
                                BasicConv(c7, c7, (7, 1), padding=(3, 0)),
                                BasicConv(c7, 192, (1, 7), padding=(0, 3)))
        self.bp = BasicConv(cin, 192, 1)

    def forward(self, x):
        p = self.bp(nn.functional.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b7(x), self.bd(x), p], 1)


class InceptionD(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.b3 = nn.Sequential(BasicConv(cin, 192, 1), BasicConv(192, 320, 3, stride=2))
        self.b7 = nn.Sequential(BasicConv(cin, 192, 1), BasicConv(192, 192, (1, 7), padding=(0, 3)),
                                BasicConv(192, 192, (7, 1), padding=(3, 0)),
                                BasicConv(192, 192, 3, stride=2))

    def forward(self, x):
        return torch.cat([self.b3(x), self.b7(x), nn.functional.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.b1 = BasicConv(cin, 320, 1)
        self.b3 = BasicConv(cin, 384, 1)
        self.b3a = BasicConv(384, 384, (1, 3), padding=(0, 1))
        self.b3b = BasicConv(384, 384, (3, 1), padding=(1, 0))
        self.bd = nn.Sequential(BasicConv(cin, 448, 1), BasicConv(448, 384, 3, padding=1))
        self.bda = BasicConv(384, 384, (1, 3), padding=(0, 1))
        self.bdb = BasicConv(384, 384, (3, 1), padding=(1, 0))
        self.bp = BasicConv(cin, 192, 1)

    def forward(self, x):
        b3 = self.b3(x)
        bd = self.bd(x)
        p = self.bp(nn.functional.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b3a(b3), self.b3b(b3), self.bda(bd), self.bdb(bd), p], 1)


class InceptionV3(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(
            BasicConv(3, 32, 3, stride=2), BasicConv(32, 32, 3), BasicConv(32, 64, 3, padding=1),
            nn.MaxPool2d(3, 2), BasicConv(64, 80, 1), BasicConv(80, 192, 3), nn.MaxPool2d(3, 2))
        self.blocks = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        y = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.fc(torch.flatten(y, 1))


class EncoderLayer(nn.Module):
    """A post-norm transformer layer; causal: each token attends to itself and those before
    it (a decoder's prefill: the mask of many decoders, -inf above the diagonal, added to the
    scaled scores)."""

    def __init__(self, hidden=768, heads=12, ffn=3072, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5
        if self.causal:
            scores = scores + torch.full((s, s), float("-inf")).triu(1)
        att = torch.softmax(scores, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    def __init__(self, layers=12, hidden=768, heads=12, ffn=3072, causal=False):
        super().__init__()
        self.layers = nn.Sequential(*[EncoderLayer(hidden, heads, ffn, causal)
                                      for _ in range(layers)])

    def forward(self, x):
        return self.layers(x)


class VisionTransformer(nn.Module):
    """ViT-B/16 at 224x224: a 16x16 stride-16 patch conv to 196 tokens of 768, a class token
    and learned positions (197 tokens), bert_base's 12 encoder layers (post-norm where
    torchvision's ViT is pre-norm: the same ops and cost), a 1000-class head on the class token.
    Next to bert_base it shows the cost of an odd token count."""

    def __init__(self, layers=12, hidden=768, heads=12, ffn=3072, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, hidden, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 197, hidden) * 0.02)
        self.encoder = BertEncoder(layers, hidden, heads, ffn)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        return self.head(self.encoder(tokens)[:, 0])


class RegNetBlock(nn.Module):
    """RegNetX's residual bottleneck (ratio 1): 1x1, a grouped 3x3 (groups of `group_width`
    channels, the stride), 1x1, with a projection shortcut where the shape changes."""

    def __init__(self, cin, out, stride, group_width):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, out, 1, bias=False), _bn(out), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(out, out, 3, stride, 1, groups=out // group_width,
                                         bias=False), _bn(out), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(out, out, 1, bias=False), _bn(out))
        self.proj = _downsample(cin, out, stride)

    def forward(self, x):
        shortcut = x if self.proj is None else self.proj(x)
        return torch.relu(shortcut + self.c(self.b(self.a(x))))


class RegNetX(nn.Module):
    """torchvision's regnet_x_400mf: stem 3 -> 32, four stages (depths 1, 2, 7, 12; widths 32,
    64, 160, 400; group width 16), each starting with stride 2."""

    def __init__(self, depths=(1, 2, 7, 12), widths=(32, 64, 160, 400), group_width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), _bn(32), nn.ReLU())
        blocks, cin = [], 32
        for depth, width in zip(depths, widths):
            for i in range(depth):
                blocks.append(RegNetBlock(cin, width, 2 if i == 0 else 1, group_width))
                cin = width
        self.trunk = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, 1000)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.trunk(
            self.stem(x)), 1), 1))


class VideoResNet18(nn.Module):
    """torchvision's r3d_18: a (3, 7, 7) stem with stride (1, 2, 2), four stages of two 3D basic
    blocks (64 to 512 channels, stride 2 in time and space from the second), 400 classes."""

    def __init__(self, classes=400):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
                                  _bn(64, 3), nn.ReLU())
        blocks, cin = [], 64
        for i in range(4):
            c = 64 * 2 ** i
            for j in range(2):
                blocks.append(BasicBlock(cin, c, 2 if (j == 0 and i > 0) else 1, dims=3))
                cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool3d(y, 1), 1))


MODELS = {
    "resnet18": (lambda: ResNet(BasicBlock, [2, 2, 2, 2]), (1, 3, 224, 224)),
    "resnet50": (lambda: ResNet(Bottleneck, [3, 4, 6, 3]), (1, 3, 224, 224)),
    "mobilenet_v2": (MobileNetV2, (1, 3, 224, 224)),
    "inception_v3": (InceptionV3, (1, 3, 299, 299)),
    "regnet_x_400mf": (RegNetX, (1, 3, 224, 224)),
    "r3d_18": (VideoResNet18, (1, 3, 16, 112, 112)),
    "bert_base": (BertEncoder, (1, 128, 768)),
    "vit_b_16": (VisionTransformer, (1, 3, 224, 224)),
    "whisper_encoder": (WhisperEncoder, (1, 80, 3000)),
    "wav2vec2_base": (Wav2Vec2, (1, 16000)),
    # bert_base's 12 layers with a causal mask over 384 tokens: a GPT-2-sized decoder's prefill
    "causal_s384": (lambda: BertEncoder(causal=True), (1, 384, 768)),
    # one encoder layer of bert_base: a transformer where a whole model is too slow to run
    # (under qemu, in tests)
    "bert_layer": (lambda: BertEncoder(layers=1), (1, 128, 768)),
}


def _randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.01)
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


def get(name, seed=0):
    """(torch module in eval mode with seeded random weights, example input shape)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    build, shape = MODELS[name]
    torch.manual_seed(seed)
    return _randomize(build(), seed).eval(), shape


def inputs(shape, n, seed=1000):
    """n fixed random inputs of `shape` (float32 numpy), the same for every engine."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype("float32") for _ in range(n)]
