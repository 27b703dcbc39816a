"""A recipe: what quantize() records about each quantized op (dtypes, shapes, quantization,
fused epilogue, edge layouts), the form it is tuned in, and which instructions may run it.

A Recipe is frozen: the passes that decide edges (requantize.py, u8_values.py, the layout
choices in tensorize.py) replace it with an updated copy. It travels on its PrimFunc as JSON
(ATTR), written with only the fields that are set, so tuning keys stay short and stable."""

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ... import intrinsics, selection
from ...intrinsics import PairSumBound
from ...shift import rebased_dtype

ATTR = "unit_tvm.recipe"
# the recipe kinds that are convolutions (NC + spatial layouts, a window, stride and padding)
CONV_KINDS = ("conv2d", "conv3d")


Kind = Literal["conv2d", "conv3d", "dense", "bmm"]
Shape = tuple[int, ...]
QScale = tuple[float, int]  # (scale, zero point) of a uint8 value
View = tuple[int, int, tuple[int, ...]]  # (source elements, offset, strides)


def _tuple(v):
    """Lists (as JSON gives them) as tuples, nested: a Recipe's shapes are hashable."""
    return tuple(_tuple(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One quantized conv2d, conv3d, dense or bmm (activation x activation matmul) op, in four
    groups of fields: what the op is (kind, shapes, window), its quantization, its fused
    epilogue, and how its edges are laid out. Flat on purpose: its JSON (to_dict) is the
    tuning database's key, and every group is read by the kernels."""

    # -- the op: kind, shapes, window -------------------------------------------------------
    kind: Kind
    in_shape: Shape  # NCHW (NCDHW), [rows, K] for dense (leading dims flattened), [B, M, K]
    w_shape: Shape  # KCRS (KCTRS; C per group), [N, K], or a bmm's second operand [B, K, N]
    out_shape: Shape  # NKHW (NKDHW), [rows, N] or [B, M, N]
    out_channels: int
    stride: Shape | None = None  # convs only: per spatial axis
    dilation: Shape | None = None
    padding: Shape | None = None  # top, left, bottom, right (conv3d: front, top, left, back...)
    groups: int = 1
    nd_in_shape: Shape | None = None  # dense on more than 2 dims: the shapes around the kernel
    nd_out_shape: Shape | None = None
    # -- its quantization -----------------------------------------------------------------
    dtype: str | None = None  # a float form (FLOAT_FORMS): "bfloat16" or "float32"; None: int8
    x_scale: float | None = None  # the activation's uint8 quantization (int8)
    x_zp: int | None = None
    y_scale: float | None = None  # bmm: its second activation's symmetric int8 scale
    x_signed: bool = False  # activation re-based to int8 for an s8 x s8 instruction
    in_u8: bool = False  # reads its input as uint8 already (in x_scale, x_zp)
    out_q: QScale | None = None  # writes uint8 for its readers (requantization)
    residual_q: QScale | None = None  # a uint8 residual's quantization
    # int8 weights checked to obey |w0| + |w1| <= this in every adjacent pair a packed word
    # holds (pair_weights.py): a pre-VNNI pair form (vpmaddubsw) is exact on them; with
    # w_pair_words = 2 the bound holds over the same pair of two consecutive words (the quad
    # form, which adds two vpmaddubsw results in int16)
    w_pair_bound: int | None = None
    w_pair_words: int | None = None
    # the output cosine the pair-bounded weights lose against 8-bit ones, estimated (reported)
    w_pair_loss: float | None = None
    # -- its fused epilogue -----------------------------------------------------------------
    relu: bool = False
    clip_max: float | None = None  # relu6-style clip
    clip_min: float | None = None  # a clip's negative lower end, after the residual (no relu)
    # (lo, hi): the op's own result clamped before the residual is added (a hardtanh, or a
    # quantized model's pair with a range around 0: relax/quantization/qdq.py)
    clamp: tuple[float, float] | None = None
    gelu: bool = False
    activation: str | None = None  # one of relax/core/activations.py's NAMES, after residual
    residual: bool = False  # adds a residual in its epilogue
    # the float32 input is multiplied by a per-channel gate argument [N, C, 1, 1] before it is
    # quantized: a squeeze-excitation's multiply folded into the conv reading it (f32_blocks)
    x_gate: bool = False
    # -- its edges' layouts -----------------------------------------------------------------
    in_block: int | None = None  # NCHW[block]c edges: input, output, residual
    out_block: int | None = None
    residual_block: int | None = None
    # bf16 bmm (relax/core/views.py): an operand read where its producer left it, as (source
    # elements, offset, strides of in_shape's / w_shape's axes) of a flat source; the result
    # written with its [B, M, N] axes in out_axes order
    x_view: View | None = None
    w_view: View | None = None
    out_axes: Shape | None = None

    # always written to JSON, even when unset (the keys recipes have always had)
    _ALWAYS = ("kind", "in_shape", "w_shape", "out_shape", "out_channels", "relu", "clip_max",
               "gelu", "residual")

    def replace(self, **changes) -> "Recipe":
        """A copy with `changes` (lists become tuples)."""
        return dataclasses.replace(self, **{k: _tuple(v) for k, v in changes.items()})

    def to_dict(self) -> dict:
        """The fields that are set (and the _ALWAYS ones), as plain JSON values."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in self._ALWAYS or v != f.default:
                out[f.name] = json.loads(json.dumps(v))  # tuples -> lists
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @staticmethod
    def from_dict(d: dict) -> "Recipe":
        """The Recipe a dict of its fields (to_dict's output, or written by hand) describes."""
        return Recipe(**{k: _tuple(v) for k, v in d.items()})

    @staticmethod
    def from_json(text: str) -> "Recipe":
        return Recipe.from_dict(json.loads(text))


@dataclass
class QuantizedOp:
    """What quantize() holds for one op while its passes decide the edges: the chain it
    replaces, its recipe (replaced, never changed in place) and its constant arguments."""

    chain: object  # chains.Chain
    recipe: Recipe
    consts: list

    def update(self, **changes) -> None:
        """Replace the recipe with a copy carrying `changes`."""
        self.recipe = self.recipe.replace(**changes)


# the float forms of an op: operands in that dtype (activations rounded to it in the kernel),
# float32 sums, no quantization to undo
FLOAT_FORMS = ("bfloat16", "float32")


def is_bf16(recipe):
    """Whether the recipe is the bfloat16 form of its op."""
    return recipe.dtype == "bfloat16"


def is_float(recipe):
    """Whether the recipe is a float form of its op (bfloat16 or float32 operands, float32
    sums), else int8."""
    return recipe.dtype in FLOAT_FORMS


def pads_with_zero(recipe) -> bool:
    """Whether the padding the recipe's kernel reads is 0 in the instruction's arithmetic, so
    that a tap reading only padding adds nothing to the accumulator (its kernel may skip it)."""
    return is_float(recipe) or (recipe.x_zp == 0 and not recipe.x_signed)


def dtypes(recipe):
    """(activation, weight, accumulator) dtypes the op's instruction takes: the activation is
    int8 when it is re-based for an s8 x s8 instruction (see for_instruction)."""
    if is_float(recipe):
        return (recipe.dtype, recipe.dtype, "float32")
    return ("int8" if recipe.x_signed else "uint8", "int8", "int32")


def for_instruction(recipe, intrin):
    """The recipe as `intrin` runs it. An s8 x s8 instruction (arm.sdot, arm.smmla) takes the
    uint8 activation re-based, x - 128, with the zero point x_zp - 128: the same real values,
    so the kernel's int32 sums differ from the u8 x s8 ones by exactly 128 * sum(w) per output
    channel, which the zero-point term absorbs (weights.rebased_comp)."""
    if is_float(recipe) or intrin.input_dtypes[0] != "int8" or recipe.x_signed:
        return recipe
    return recipe.replace(x_signed=True)


class Blocks(NamedTuple):
    """How a kernel packs channels for its instruction: NCHW[x]c activations, NCHW[y]c
    accumulators, KCRS[x/word]c[y]k[word]c weights (a depthwise conv's: x taps together).
    panel: a dense layer's weights hold `panel` blocks of y columns interleaved per step of
    the reduction, N[K/x][panel][x/word]k[y]n[word]k, where the register tile reads that many
    blocks at once (the strategy's weight_panel): the tile then reads one stream, not `panel`."""

    x: int
    y: int
    word: int
    panel: int = 1


def blocks_of(intrin):
    """The Blocks an instruction reads directly (Intrinsic.channel_blocks, weight_word)."""
    x, y = intrin.channel_blocks
    return Blocks(x, y, intrin.weight_word)


def folds_width(recipe, blocks: Blocks) -> bool:
    """Whether a conv2d (conv3d) reads its window's columns as the instruction's reduction
    lanes (a word of neighbouring input pixels of one channel) rather than a word of channels
    of one pixel. An input with few channels (an RGB stem) padded to a whole word computes 4/3
    of its work; a 7-column window padded to two words, 8/7. Only where one word is the whole
    channel block (the vector instructions; AMX reads 64 channels at once) and the input is
    NCHW (NCDHW)."""
    if (recipe.kind not in CONV_KINDS or recipe.groups != 1 or recipe.in_block
            or blocks.x != blocks.word or recipe.dilation[-1] != 1):
        return False
    c, s, word = recipe.in_shape[1], recipe.w_shape[-1], blocks.word
    return c % word != 0 and -(-s // word) * word * c < -(-c // word) * word * s


def group_channels(recipe):
    """(input, output) channels per group of a conv (the whole op's for groups=1)."""
    c, k = recipe.in_shape[1], recipe.out_channels
    return c // recipe.groups, k // recipe.groups


def fits_groups(recipe, intrin):
    """Whether intrin's channel blocks tile every group of a grouped conv exactly (a group's
    input channels by its reduction block, its output channels by its output block), so that
    each output block reads one group; always true for groups=1."""
    if recipe.groups == 1:
        return True
    x, y = intrin.channel_blocks
    cg, kg = group_channels(recipe)
    return cg % x == 0 and kg % y == 0


def is_depthwise(recipe):
    """Whether the recipe is a depthwise conv: one input and one output channel per group."""
    groups = recipe.groups
    return (recipe.kind == "conv2d" and groups > 1 and recipe.in_shape[1] == groups
            and recipe.out_channels == groups)


def out_dtype(recipe):
    """uint8 when the op requantizes for its consumer, else float32."""
    return "uint8" if recipe.out_q else "float32"


def packed_shape(shape, block):
    """NCHW -> NCHW[block]c: (n, ceil(c / block), h, w, block); any number of spatial axes
    (NCDHW -> NCDHW[block]c)."""
    n, c, *spatial = shape
    return [n, -(-c // block), *spatial, block]


def blocked_index(idx, block):
    """The NCHW[block]c index of the logical NC... index idx (any number of spatial axes)."""
    b, c, *spatial = idx
    return (b, c // block, *spatial, c % block)


def in_shape(recipe):
    """Shape of the op's activation argument: NCHW, or NCHW[in_block]c on a packed edge, or
    the flat source a bmm reads its first operand from (x_view)."""
    if recipe.x_view:
        return [recipe.x_view[0]]
    blk = recipe.in_block
    return packed_shape(recipe.in_shape, blk) if blk else list(recipe.in_shape)


def w_arg_shape(recipe):
    """Shape of a bmm's second-operand argument: w_shape, or its flat source (w_view)."""
    return [recipe.w_view[0]] if recipe.w_view else list(recipe.w_shape)


def out_shape(recipe):
    """Shape of the op's result: NCHW (or [rows, n]), or NCHW[out_block]c on a packed edge, or
    a bmm's [B, M, N] in out_axes order."""
    if recipe.out_axes:
        return [recipe.out_shape[a] for a in recipe.out_axes]
    blk = recipe.out_block
    return packed_shape(recipe.out_shape, blk) if blk else list(recipe.out_shape)


def tuning_form(recipe):
    """The recipe with its quantization constants replaced by fixed ones: what the schedule
    depends on (shapes, layouts, which epilogue steps) without what calibration chose. Layers
    of one shape (BERT's 12 encoder layers, ResNet's repeated blocks) tune once; the tuned
    config schedules each layer's own recipe, whose loop nest differs only in constants.
    Clamps around 0 (clamp; clip_min with its clip_max: a hardtanh, or what a quantized
    model's pairs leave) are left out: two compares per vector do not change which loop nest
    is fastest, and a QDQ file's layers share the configs of its float32 model's."""
    if is_float(recipe):
        return recipe  # no quantization constants
    pair_clamp = recipe.clip_min is not None
    return recipe.replace(w_pair_loss=None, x_scale=0.5, x_zp=1,
                          y_scale=0.75 if recipe.y_scale else None,
                          out_q=(0.25, 2) if recipe.out_q else None,
                          residual_q=(0.125, 3) if recipe.residual_q else None,
                          clip_max=6.0 if recipe.clip_max is not None and not pair_clamp
                          else None, clip_min=None, clamp=None)


def implied_clamps_dropped(recipe: "Recipe") -> "Recipe":
    """The recipe without an end clamp that its uint8 result applies anyway: requantized to
    (scale, zp) it saturates at -zp * scale and (255 - zp) * scale, so a clip_max (clip_min)
    at or beyond that end cuts nothing more, bit for bit (a quantized model's pair capping a
    value that its readers read as uint8)."""
    if not recipe.out_q or is_float(recipe):
        return recipe
    scale, zp = recipe.out_q
    changes = {}
    # within 1e-3 of a step of the end, the clamped value still rounds to the end
    if recipe.clip_max is not None and recipe.clip_max >= (255 - zp - 1e-3) * scale:
        changes["clip_max"] = None
    if recipe.clip_min is not None and recipe.clip_min <= (1e-3 - zp) * scale:
        changes["clip_min"] = None
    return recipe.replace(**changes) if changes else recipe


def weight_bound(recipe) -> PairSumBound | None:
    """The PairSumBound the quantizer checked the recipe's weights under, or None."""
    if recipe.w_pair_bound is None:
        return None
    return PairSumBound(recipe.w_pair_bound, recipe.w_pair_words or 1)


def pair_form_exact(recipe, intrin) -> bool:
    """Whether `intrin`, exact only under a weight pair bound, is exact on the recipe's
    weights: the quantizer checked them under a bound that implies the instruction's (quad
    bounded weights obey the pair bound too), and the activation is the uint8 the instruction
    takes (not re-based)."""
    needed, checked = intrin.weight_bound, weight_bound(recipe)
    return (needed is not None and checked is not None and checked.implies(needed)
            and not recipe.x_signed)


def weight_pair_bounds(target) -> list[PairSumBound]:
    """The PairSumBounds the quantizer may give int8 weights on `target`, fastest instruction
    first: those of the u8 x s8 vector instructions it can run that are exact only under one
    (the quad and pair forms of a host without VNNI); [] where the first such instruction is
    exact on any weights (vpdpbusd, AMX and the rest)."""
    bounds = []
    for intrin in intrinsics.for_target(target):
        if (intrin.input_dtypes == ("uint8", "int8") and intrin.broadcast_operand
                and not intrin.lanewise):
            if intrin.weight_bound is None:
                break
            if intrin.weight_bound not in bounds:
                bounds.append(intrin.weight_bound)
    return bounds


def bounds_that_run(recipe, bounds, target) -> list[PairSumBound]:
    """The bounds (of weight_pair_bounds, fastest first) whose own instruction selection would
    run the recipe on, were its weights under them: a bound's precision is worth spending only
    there (a 3-channel stem pads the quad form's 8-channel block past selection's limit and
    runs the pair form)."""
    kept = []
    for bound in bounds:
        bounded = recipe.replace(w_pair_bound=bound.bound,
                                 w_pair_words=bound.words if bound.words > 1 else None)
        found = candidates(bounded, target)
        if found and found[0].weight_bound == bound:
            kept.append(bound)
    return kept


def candidates(recipe, target):
    """Instructions that can run the recipe on target, best first (unit_tvm.selection's rule
    on the padding of the packed channels)."""
    c = recipe.in_shape[1] if recipe.kind in CONV_KINDS else recipe.in_shape[-1]
    k = recipe.out_channels
    a_t, w_t, acc_t = dtypes(recipe)
    depthwise = is_depthwise(recipe)
    if recipe.groups != 1 and not depthwise:
        c, k = group_channels(recipe)  # a grouped conv: whole groups per block, no padding
    if depthwise and recipe.dilation[1] != 1:
        return []  # a lanewise instruction reads neighbouring pixels: not a dilated window
    usable, rebased = [], []
    for intrin in intrinsics.for_target(target):
        if intrin.output_dtype != acc_t or intrin.input_dtypes[1] != w_t:
            continue
        if intrin.lanewise != depthwise:
            continue  # a depthwise window has no channel reduction; a dense conv no lanewise one
        if intrin.operand_ranges and not pair_form_exact(recipe, intrin):
            continue  # vpmaddubsw needs u7 activations (the quantizer gives u8) or weights
            # the quantizer bounded in pairs
        if not depthwise and not fits_groups(recipe, intrin):
            continue
        # a conv folding its window's columns into the reduction pads the window, not c
        reduce = recipe.w_shape[3] if folds_width(recipe, blocks_of(intrin)) else c
        cand = selection.Candidate(intrin, selection.channel_waste(intrin, reduce, k))
        if intrin.input_dtypes[0] == a_t:
            usable.append(cand)
        elif rebased_dtype(a_t) == intrin.input_dtypes[0] and recipe.kind != "bmm":
            # (a bmm's zero-point term is computed at run time for u8 x s8 sums only)
            rebased.append(cand)
    return [cand.intrinsic for cand in selection.with_rebased(usable, rebased)]


def has_float32_instruction(target) -> bool:
    """Whether `target` has an instruction for a float32 matmul or conv (a multiply-add such as
    vfmadd231ps or fmla): then the float32 form of an op runs on it, not on TVM's loops."""
    probe = Recipe(kind="dense", in_shape=(16, 64), w_shape=(64, 64), out_shape=(16, 64),
                   out_channels=64, dtype="float32")
    return bool(candidates(probe, target))
