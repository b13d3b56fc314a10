"""The ONNX graph behind ``ct2_flash.loop.row_scores``: the vectorised part of CTranslate2's CPU
log-softmax, for logit rows at one column each.

``python -m ct2_flash.converters.row_graph`` rewrites ``ct2_flash/data/row_lane_sums.onnx``
(needs ``onnx``, in the ``[train]`` extra); the runtime only loads the file.
"""

from __future__ import annotations

from ct2_flash.loop.row_scores import GRAPH_FILE

OPSET = (
    17  # pinned: ReduceMax with an axes attribute, CumSum, Slice and GatherElements as ONNX Runtime >= 1.17 runs them
)
IR_VERSION = 8
# Slice's "to the end" (int64).
_END = 2**62


def build_row_lane_sums():
    """The graph.

    Inputs: ``rows`` [r, v] float32 logits (-inf allowed), ``columns`` [r, 1] int64, ``body``
    [1] int64 (the leading columns the engine sums in vector lanes: v rounded down to the lane
    width), ``lane_shape`` [3] int64 ``(r, body / width, width)``.

    Outputs: ``peaks`` [r, 1] row maxima; ``lane_sums`` [r, 1, width]: per lane, the
    exponentials ``exp(row - peak)`` of the body added one after the other in float32, as a
    vector accumulator does (CumSum runs in order, unlike a reduction); ``tail`` [r, v - body]
    the exponentials after the body; ``picked`` [r, 1] ``rows[i, columns[i]]``.
    """
    from onnx import TensorProto, helper

    def constant(name, values, shape=None):
        return helper.make_node(
            "Constant",
            [],
            [name],
            value=helper.make_tensor(name, TensorProto.INT64, [len(values)] if shape is None else shape, values),
        )

    graph = helper.make_graph(
        [
            constant("axis", [1]),
            constant("scan_axis", [1], shape=[]),
            constant("zero", [0]),
            constant("last", [-1]),
            constant("end", [_END]),
            helper.make_node("ReduceMax", ["rows"], ["peaks"], axes=[1], keepdims=1),
            helper.make_node("Sub", ["rows", "peaks"], ["shifted"]),
            helper.make_node("Exp", ["shifted"], ["terms"]),
            helper.make_node("Slice", ["terms", "zero", "body", "axis"], ["body_terms"]),
            helper.make_node("Reshape", ["body_terms", "lane_shape"], ["lanes"]),
            helper.make_node("CumSum", ["lanes", "scan_axis"], ["running"]),
            helper.make_node("Slice", ["running", "last", "end", "axis"], ["lane_sums"]),
            helper.make_node("Slice", ["terms", "body", "end", "axis"], ["tail"]),
            helper.make_node("GatherElements", ["rows", "columns"], ["picked"], axis=1),
        ],
        "row_lane_sums",
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["r", "v"]),
            helper.make_tensor_value_info("columns", TensorProto.INT64, ["r", 1]),
            helper.make_tensor_value_info("body", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("lane_shape", TensorProto.INT64, [3]),
        ],
        [
            helper.make_tensor_value_info("peaks", TensorProto.FLOAT, ["r", 1]),
            helper.make_tensor_value_info("lane_sums", TensorProto.FLOAT, ["r", 1, "width"]),
            helper.make_tensor_value_info("tail", TensorProto.FLOAT, ["r", "t"]),
            helper.make_tensor_value_info("picked", TensorProto.FLOAT, ["r", 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ct2-flash")
    model.ir_version = IR_VERSION
    return model


def main() -> None:
    import onnx

    model = build_row_lane_sums()
    onnx.checker.check_model(model)
    onnx.save(model, GRAPH_FILE)


if __name__ == "__main__":
    main()
