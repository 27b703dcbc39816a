"""A recipe (the dict quantize() attaches to each quantized op): what it says about dtypes,
shapes and layouts, the form it is tuned in, and which instructions may run it."""

from typing import NamedTuple

from .. import intrinsics, selection
from ..shift import rebased_dtype

ATTR = "unit_tvm.recipe"


def is_bf16(recipe):
    """Whether the recipe is the bfloat16 form of its op (else int8)."""
    return recipe.get("dtype") == "bfloat16"


def dtypes(recipe):
    """(activation, weight, accumulator) dtypes the op's instruction takes: the activation is
    int8 when it is re-based for an s8 x s8 instruction (see for_instruction)."""
    if is_bf16(recipe):
        return ("bfloat16", "bfloat16", "float32")
    return ("int8" if recipe.get("x_signed") else "uint8", "int8", "int32")


def for_instruction(recipe, intrin):
    """The recipe as `intrin` runs it. An s8 x s8 instruction (arm.sdot, arm.smmla) takes the
    uint8 activation re-based, x - 128, with the zero point x_zp - 128: the same real values,
    so the kernel's int32 sums differ from the u8 x s8 ones by exactly 128 * sum(w) per output
    channel, which the zero-point term absorbs (weights.rebased_comp)."""
    if is_bf16(recipe) or intrin.input_dtypes[0] != "int8" or recipe.get("x_signed"):
        return recipe
    return dict(recipe, x_signed=True)


class Blocks(NamedTuple):
    """How a kernel packs channels for its instruction: NCHW[x]c activations, NCHW[y]c
    accumulators, KCRS[x/word]c[y]k[word]c weights (a depthwise conv's: x taps together)."""

    x: int
    y: int
    word: int


def blocks_of(intrin):
    """The Blocks an instruction reads directly (Intrinsic.channel_blocks, weight_word)."""
    x, y = intrin.channel_blocks
    return Blocks(x, y, intrin.weight_word)


def is_depthwise(recipe):
    """Whether the recipe is a depthwise conv: one input and one output channel per group."""
    groups = recipe.get("groups", 1)
    return (recipe["kind"] == "conv2d" and groups > 1 and recipe["in_shape"][1] == groups
            and recipe["out_channels"] == groups)


def out_dtype(recipe):
    """uint8 when the op requantizes for its consumer, else float32."""
    return "uint8" if recipe.get("out_q") else "float32"


def packed_shape(shape, block):
    """NCHW -> NCHW[block]c: (n, ceil(c / block), h, w, block)."""
    n, c, h, w = shape
    return [n, -(-c // block), h, w, block]


def in_shape(recipe):
    """Shape of the op's activation argument: NCHW, or NCHW[in_block]c on a packed edge."""
    blk = recipe.get("in_block")
    return packed_shape(recipe["in_shape"], blk) if blk else recipe["in_shape"]


def out_shape(recipe):
    """Shape of the op's result: NCHW (or [rows, n]), or NCHW[out_block]c on a packed edge."""
    blk = recipe.get("out_block")
    return packed_shape(recipe["out_shape"], blk) if blk else recipe["out_shape"]


def tuning_form(recipe):
    """The recipe with its quantization constants replaced by fixed ones: what the schedule
    depends on (shapes, layouts, which epilogue steps) without what calibration chose. Layers
    of one shape (BERT's 12 encoder layers, ResNet's repeated blocks) tune once; the tuned
    config schedules each layer's own recipe, whose loop nest differs only in constants."""
    if is_bf16(recipe):
        return dict(recipe)  # no quantization constants
    form = dict(recipe, x_scale=0.5, x_zp=1)
    if form.get("out_q"):
        form["out_q"] = [0.25, 2]
    if form.get("residual_q"):
        form["residual_q"] = [0.125, 3]
    if form.get("clip_max") is not None:
        form["clip_max"] = 6.0
    return form


def candidates(recipe, target):
    """Instructions that can run the recipe on target, best first (unit_tvm.selection's rule
    on the padding of the packed channels)."""
    c = recipe["in_shape"][1]
    k = recipe["out_channels"]
    a_t, w_t, acc_t = dtypes(recipe)
    depthwise = is_depthwise(recipe)
    if recipe.get("groups", 1) != 1 and not depthwise:
        return []
    if depthwise and recipe["dilation"][1] != 1:
        return []  # a lanewise instruction reads neighbouring pixels: not a dilated window
    usable, rebased = [], []
    for intrin in intrinsics.for_target(target):
        if intrin.output_dtype != acc_t or intrin.input_dtypes[1] != w_t:
            continue
        if intrin.lanewise != depthwise:
            continue  # a depthwise window has no channel reduction; a dense conv no lanewise one
        if intrin.operand_ranges:
            continue  # vpmaddubsw needs u7 activations; the quantizer produces u8
        cand = selection.Candidate(intrin, selection.channel_waste(intrin, c, k))
        if intrin.input_dtypes[0] == a_t:
            usable.append(cand)
        elif rebased_dtype(a_t) == intrin.input_dtypes[0]:
            rebased.append(cand)
    return [cand.intrinsic for cand in selection.with_rebased(usable, rebased)]
