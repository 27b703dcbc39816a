"""A compiled decoder at run time: its key/value cache, the prefill and decode steps, greedy
generation."""

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .config import DecoderConfig


@dataclass(frozen=True)
class StepOutput:
    """What one step returns: the logits of its last real token, and how many tokens it took."""

    logits: np.ndarray  # [vocab], float32
    tokens: int


class DecoderLM:
    """A decoder compiled by unit_tvm.llm.compile: `generate` (greedy), and `prefill` / `decode`
    on their own (for timing). The cache holds `context` positions; `reset` empties it."""

    def __init__(self, config: DecoderConfig, embed: np.ndarray, executables: dict, head,
                 context: int, device=None):
        self.config = config
        self.context = context
        self._embed = embed
        self._device = device or tvm.cpu()
        # tokens per step -> VirtualMachine; 1 is the decode step, the others prefill chunks
        self._steps = {t: relax.VirtualMachine(ex, self._device) for t, ex in executables.items()}
        self._head = relax.VirtualMachine(head, self._device)  # final norm + LM head
        # keys [kv_heads, head_dim, context], values [kv_heads, context, head_dim] (graph.py)
        k_shape = (config.kv_heads, config.head_dim, context)
        v_shape = (config.kv_heads, context, config.head_dim)
        self._k = [tvm.runtime.tensor(np.zeros(k_shape, np.float32), self._device)
                   for _ in range(config.layers)]
        self._v = [tvm.runtime.tensor(np.zeros(v_shape, np.float32), self._device)
                   for _ in range(config.layers)]
        # numpy views of the same memory: new keys / values are written in place
        self._k_np = [np.from_dlpack(t) for t in self._k]
        self._v_np = [np.from_dlpack(t) for t in self._v]
        self.length = 0  # positions of the cache in use

    @property
    def step_lengths(self) -> tuple[int, ...]:
        """Tokens per step of each compiled step function (1: decode)."""
        return tuple(sorted(self._steps))

    def step_vm(self, tokens: int) -> relax.VirtualMachine:
        """The VirtualMachine of the step taking `tokens` tokens (1: decode), e.g. to profile."""
        return self._steps[tokens]

    def head_vm(self) -> relax.VirtualMachine:
        """The VirtualMachine of the final norm and LM head (a step's row -> logits)."""
        return self._head

    def reset(self) -> None:
        """Forget the cached sequence (the next prefill starts at position 0)."""
        self.length = 0

    def _run(self, ids: np.ndarray, tokens: int, logits: bool = True) -> np.ndarray | None:
        """One step of `tokens` slots, the first len(ids) real: logits of the last real one
        (None without `logits`: the head is not run)."""
        n, start = len(ids), self.length
        padded = np.zeros(tokens, np.int64)
        padded[:n] = ids
        hidden = self._embed[padded]
        pos = np.arange(start, start + tokens, dtype=np.int32)
        args = [tvm.runtime.tensor(a, self._device) for a in (
            hidden, pos, np.array([start], np.int32), np.array([n - 1], np.int32))]
        row, new_k, new_v = self._steps[tokens]["main"](*args, *self._k, *self._v)
        new_k, new_v = new_k.numpy(), new_v.numpy()
        for i in range(self.config.layers):
            self._k_np[i][:, :, start:start + n] = new_k[i, :, :, :n]
            self._v_np[i][:, start:start + n] = new_v[i, :, :n]
        self.length = start + n
        return self._head["main"](row).numpy()[0] if logits else None

    def _chunk(self, remaining: int) -> int:
        """The step length for the next chunk of a prompt: the shortest compiled one that takes
        all that remains, else the longest that fits the cache."""
        room = self.context - self.length
        fitting = [t for t in self.step_lengths if t <= room]
        if not fitting:
            raise ValueError(f"the cache is full ({self.context} positions); reset() or compile "
                             "with a larger context")
        covering = [t for t in fitting if t >= remaining]
        return covering[0] if covering else fitting[-1]

    def prefill(self, input_ids) -> StepOutput:
        """Append the prompt `input_ids` (1-D ids) to the cache; the logits of its last token."""
        ids = np.asarray(input_ids, np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if ids.min() < 0 or ids.max() >= self.config.vocab:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab})")
        if self.length + ids.size > self.context:
            raise ValueError(f"{self.length} cached + {ids.size} new tokens exceed the context "
                             f"of {self.context}")
        done, logits = 0, None
        while done < ids.size:
            tokens = self._chunk(ids.size - done)
            part = ids[done:done + tokens]
            done += part.size
            # logits of the prompt's last token only: earlier chunks skip the LM head
            logits = self._run(part, tokens, logits=done == ids.size)
        return StepOutput(logits, int(ids.size))

    def decode(self, token: int) -> StepOutput:
        """Append one token; the logits after it."""
        return self.prefill([token])

    def generate(self, input_ids, max_new_tokens: int, stop_at_eos: bool = True):
        """Greedy generation from an empty cache, as Hugging Face's generate(do_sample=False):
        the prompt followed by the new tokens, [1, length] (a torch tensor for a torch input,
        else numpy int64). Stops early at the model's end-of-sequence token when stop_at_eos."""
        ids = np.asarray(input_ids.cpu() if hasattr(input_ids, "cpu") else input_ids, np.int64)
        if ids.ndim == 2 and ids.shape[0] != 1:
            raise ValueError(f"generate takes one sequence (batch 1), got shape {ids.shape}")
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        ids = ids.reshape(-1)
        out = list(ids)
        self.reset()
        if max_new_tokens:
            logits = self.prefill(ids).logits
            for step in range(max_new_tokens):
                token = int(np.argmax(logits))
                out.append(token)
                if (stop_at_eos and token in self.config.eos_token_id) or \
                        step == max_new_tokens - 1:
                    break
                logits = self.decode(token).logits
        result = np.asarray(out, np.int64)[None, :]
        if hasattr(input_ids, "cpu"):
            import torch  # the caller's type back: torch is already loaded when it passed one
            return torch.from_numpy(result)
        return result
