"""Speech models of the zoo: convolutions over time in front of a transformer, written with
torch's own nn.TransformerEncoderLayer (nn.MultiheadAttention inside), as users write them.

- WhisperEncoder: Whisper tiny's audio encoder (Radford et al. 2022): 80 log-mel channels of
  3000 frames (30 s), two conv1d of width 3 (the second stride 2) with GELU, sinusoidal
  positions, four pre-norm layers of width 384 (6 heads, FFN 1536), a final layer norm.
- Wav2Vec2: wav2vec 2.0 base (Baevski et al. 2020) on one second of 16 kHz audio: the feature
  encoder (seven bias-free conv1d of 512 channels, widths 10, 3, 3, 3, 3, 2, 2 and strides 5,
  2, 2, 2, 2, 2, 2; a per-channel group norm after the first; GELU), the projection to 768,
  the positional conv (width 128, 16 groups) and twelve post-norm layers (12 heads, FFN 3072).
"""

import math

import torch
from torch import nn


def _sinusoids(length, channels):
    """Whisper's fixed positional embedding: sines then cosines of log-spaced timescales."""
    scales = torch.exp(-math.log(10000) / (channels // 2 - 1) * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * scales[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


def _layers(n, width, heads, ffn, norm_first):
    return nn.ModuleList(nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0,
                                                    activation="gelu", batch_first=True,
                                                    norm_first=norm_first) for _ in range(n))


class WhisperEncoder(nn.Module):
    def __init__(self, mels=80, frames=3000, width=384, heads=6, ffn=1536, layers=4):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.register_buffer("positions", _sinusoids(frames // 2, width))
        self.layers = _layers(layers, width, heads, ffn, norm_first=True)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        x = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(x))))
        x = x.permute(0, 2, 1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Wav2Vec2(nn.Module):
    CONVS = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))  # (width, stride)

    def __init__(self, channels=512, width=768, heads=12, ffn=3072, layers=12):
        super().__init__()
        convs, cin = [], 1
        for k, s in self.CONVS:
            convs.append(nn.Conv1d(cin, channels, k, stride=s, bias=False))
            cin = channels
        self.convs = nn.ModuleList(convs)
        self.group_norm = nn.GroupNorm(channels, channels)
        self.project_norm = nn.LayerNorm(channels)
        self.project = nn.Linear(channels, width)
        self.pos_conv = nn.Conv1d(width, width, 128, padding=64, groups=16)
        self.norm = nn.LayerNorm(width)
        self.layers = _layers(layers, width, heads, ffn, norm_first=False)

    def forward(self, audio):
        x = audio[:, None, :]
        for i, conv in enumerate(self.convs):
            x = conv(x)
            x = nn.functional.gelu(self.group_norm(x) if i == 0 else x)
        x = self.project(self.project_norm(x.transpose(1, 2)))
        # an even window with padding 64 gives one frame too many: the last is dropped
        pos = nn.functional.gelu(self.pos_conv(x.transpose(1, 2))[:, :, :-1])
        x = self.norm(x + pos.transpose(1, 2))
        for layer in self.layers:
            x = layer(x)
        return x
