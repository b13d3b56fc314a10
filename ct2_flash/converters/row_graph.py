"""The ONNX graph behind ``ct2_flash.row_scores``: log-softmax of logit rows at one column each.

``python -m ct2_flash.converters.row_graph`` rewrites ``ct2_flash/data/row_log_softmax.onnx``
(needs ``onnx``, in the ``[train]`` extra); the runtime only loads the file.
"""

from __future__ import annotations

import os

OPSET = 17  # pinned: LogSoftmax over the last axis and GatherElements as ONNX Runtime >= 1.17 runs them
IR_VERSION = 8
GRAPH_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "row_log_softmax.onnx")


def build_row_log_softmax():
    """The graph: ``rows`` [r, v] float32, ``columns`` [r, 1] int64 -> ``values`` [r, 1] float32,
    ``log_softmax(rows, axis=-1)[i, columns[i]]``."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("LogSoftmax", ["rows"], ["log_softmax"], axis=-1),
         helper.make_node("GatherElements", ["log_softmax", "columns"], ["values"], axis=1)],
        "row_log_softmax",
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["r", "v"]),
         helper.make_tensor_value_info("columns", TensorProto.INT64, ["r", 1])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["r", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ct2-flash")
    model.ir_version = IR_VERSION
    return model


def main() -> None:
    import onnx

    model = build_row_log_softmax()
    onnx.checker.check_model(model)
    onnx.save(model, GRAPH_FILE)


if __name__ == "__main__":
    main()
