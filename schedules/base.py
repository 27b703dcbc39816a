"""The interface every strategy offers: the rewriter, the tuner and the builders call only this,
so none of them asks which target it is on. A strategy is a module (schedules/cpu.py,
schedules/gpu.py) whose functions match `Strategy`; `schedules.for_target` picks it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tvm
from tvm import s_tir

if TYPE_CHECKING:
    from unit_tvm.intrinsics import Intrinsic
    from unit_tvm.prepare import Prepared


class Config(Protocol):
    """A strategy's knobs for one op: frozen, hashable, and written to the tuning database."""

    def key(self) -> dict[str, Any]:
        """The config as a JSON-able dict (the database record's `config`)."""


class Strategy(Protocol):
    """Loops around a tensorized core for one kind of target."""

    def prepare_options(self, target: tvm.target.Target) -> dict[str, Any]:
        """Keyword arguments of unit_tvm.prepare.prepare for this target (how operands are
        staged, whether a register tile's columns are padded)."""

    def tile_columns(self, prepared: Prepared, intrin: Intrinsic,
                     target: tvm.target.Target | None) -> int | None:
        """Output columns the default tile wants computed where they differ from those the
        op was prepared with (prepare_options' rule), else None: the rewriter then prepares
        the op again with them."""

    def schedule(self, prepared: Prepared, intrin: Intrinsic, config: Any = None,
                 target: tvm.target.Target | None = None) -> s_tir.Schedule:
        """The Prepared graph scheduled with `config` (None: `default`) and tensorized."""

    def default(self, prepared: Prepared, target: tvm.target.Target) -> Config:
        """The config used without tuning."""

    def space(self, prepared: Prepared, target: tvm.target.Target) -> list:
        """Every config the tuner may try, the default first."""

    def seeds(self, prepared: Prepared, target: tvm.target.Target) -> list:
        """Configs of the space the tuner measures right after the default, before it samples
        the rest at random (may be empty)."""

    def features(self, config: Any, prepared: Prepared,
                 target: tvm.target.Target) -> np.ndarray:
        """Numbers describing a config for the tuner's cost model."""

    def from_key(self, key: dict[str, Any]) -> Config:
        """The config a database record names (ValueError / KeyError when it names none)."""

    def weight_panel(self, config: Any, prepared: Prepared) -> int:
        """Blocks of the weights' lanes the config's tile reads per reduction step, packed
        together where the weights are packed at compile time (1: the blocks stay apart)."""

    def describe(self, config: Any, prepared: Prepared) -> str:
        """The config in a few words, with the op's loop names (for `unit-tvm profile`)."""
