"""Model frontends: PyTorch (torch.export) and ONNX, both to a Relax IRModule."""

import contextlib
import io
import sys

from .onnx_qoperator import qoperator_as_qdq
from .relax.frontend.fixes import matmul_einsum


def from_torch(module, example_inputs):
    """torch.nn.Module (eval mode) -> Relax IRModule via torch.export, weights as constants."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    module = module.eval()
    with torch.no_grad():
        exported = torch.export.export(module, tuple(example_inputs))
    return from_exported_program(_without_empty_cat_inputs(exported))


def _without_empty_cat_inputs(exported):
    """The exported program with the empty 1-D inputs of every aten.cat left out: torch.cat
    skips them (its legacy rule), TVM's translator refuses the differing ranks. Hugging Face's
    decoders (GPT-2, Llama, Qwen2) concatenate each layer's keys and values to an empty cache
    that way; a cat left with one input becomes that input."""
    graph = exported.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or "aten.cat" not in str(node.target):
            continue
        parts = list(node.args[0])
        kept = [p for p in parts if not _empty_1d(p)]
        if len(kept) == len(parts) or not kept:
            continue
        changed = True
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
    if changed:
        graph.eliminate_dead_code()
        exported.graph_module.recompile()
    return exported


def _empty_1d(node):
    shape = getattr(getattr(node, "meta", {}).get("val"), "shape", None)
    return shape is not None and len(shape) == 1 and int(shape[0]) == 0


def from_onnx(model, shapes=None):
    """ONNX model (path or onnx.ModelProto) -> Relax IRModule, initializers as constants.

    A QOperator file (QLinearConv, QGemm, ...) is read as its QDQ form (onnx_qoperator.py).
    shapes: {input name: shape} for inputs with symbolic dimensions. A model that computes
    shapes at run time (Shape -> Gather -> Pad / Reshape / Slice, as exports of Swin and MaxViT
    do) either stops TVM's importer or leaves tensors of unknown shape that no later pass can
    lay out; it is imported again after ONNX Runtime's basic graph optimizations have folded
    those computations for the fixed input shapes (needs onnxruntime, e.g. from the `bench`
    extra), and the import with fewer unknown shapes is kept.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    model = qoperator_as_qdq(_einsums_as_matmuls(model))
    refused, said = None, io.StringIO()
    try:
        # TVM's importer prints the failing operator before raising: shown with the first
        # import's result, not when the folded import below replaces it
        with contextlib.redirect_stdout(said):
            mod = _from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as error:  # TVM raises its own error kinds, TypeError, ValueError...
        mod, refused = None, error
    unknown = None if mod is None else _unknown_shapes(mod)
    if unknown == 0:
        sys.stdout.write(said.getvalue())
        return mod
    try:
        folded = _folded_onnx(model, shapes or {})
        if folded is not None:
            again = _from_onnx(folded, shape_dict=shapes, keep_params_in_input=False)
            if mod is None or _unknown_shapes(again) < unknown:
                return again
    except Exception:
        pass  # the first import (or TVM's reason for refusing it) is the one to keep
    sys.stdout.write(said.getvalue())
    if mod is None:
        raise refused
    return mod


def _einsums_as_matmuls(model):
    """The ONNX model with every Einsum that is a batched matrix product written as Transpose +
    MatMul + Transpose (the reading of relax.frontend_fixes.matmul_einsum): TVM's importer
    makes an Einsum one naive kernel of its own (maxvit_t: 38% of its time) that neither
    quantize nor the attention paths see; a MatMul they do."""
    import onnx
    from onnx import helper


    def rewritten(node, k):
        eq = next((helper.get_attribute_value(a) for a in node.attribute
                   if a.name == "equation"), b"")
        form = matmul_einsum(eq.decode() if isinstance(eq, bytes) else eq) \
            if len(node.input) == 2 else None
        if form is None:
            return [node]
        nodes, names = [], []
        for i, (name, perm) in enumerate(zip(node.input, (form.left, form.right))):
            if perm is not None:
                nodes.append(helper.make_node("Transpose", [name], [f"{name}__einsum{k}_{i}"],
                                              perm=perm))
                name = f"{name}__einsum{k}_{i}"
            names.append(name)
        if form.out is None:
            return nodes + [helper.make_node("MatMul", names, list(node.output))]
        product = f"{node.output[0]}__einsum{k}_mm"
        return nodes + [helper.make_node("MatMul", names, [product]),
                        helper.make_node("Transpose", [product], list(node.output),
                                         perm=form.out)]

    if not any(n.op_type == "Einsum" for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [m for k, n in enumerate(model.graph.node)
             for m in (rewritten(n, k) if n.op_type == "Einsum" else [n])]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _unknown_shapes(mod) -> int:
    """How many tensors bound in main have no static shape."""
    from tvm import relax

    count = 0

    def visit(expr):
        nonlocal count
        if isinstance(expr, relax.Var) and isinstance(expr.ty, relax.TensorType) \
                and expr.ty.shape is None:
            count += 1

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return count


def _folded_onnx(model, shapes):
    """The model with its shape computations folded by ONNX Runtime's basic optimizations
    (constant folding, standard ONNX ops only) for `shapes` (symbolic input dimensions
    otherwise 1), or None without onnxruntime."""
    import tempfile

    import onnx

    try:
        import onnxruntime as ort
    except ImportError:
        return None
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        dims = value.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if i < len(shapes.get(value.name, ())):
                d.dim_value = int(shapes[value.name][i])
            elif d.dim_value <= 0:
                d.dim_value = 1
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = f"{tmp}/folded.onnx"
        ort.InferenceSession(fixed.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


@contextlib.contextmanager
def attention_as_ops():
    """Within the block, torch's nn.MultiheadAttention and nn.TransformerEncoderLayer run as
    their ops: in eval mode without gradients they otherwise call one fused kernel
    (aten::_transformer_encoder_layer_fwd) that ONNX export refuses and that makes OpenVINO's
    tracing fail its sanity check. torch.export does not take that path."""
    import torch

    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def export_onnx(module, example_inputs, path):
    """Write a torch module to an ONNX file (opset 17) for ONNX Runtime and the ONNX frontend."""
    import torch

    with torch.no_grad(), attention_as_ops():
        torch.onnx.export(module.eval(), tuple(example_inputs), path, opset_version=17,
                          input_names=[f"input{i}" for i in range(len(example_inputs))],
                          dynamo=False)
    return path
