"""``capture._fusion_groups`` on hand-made steps: which chains TensorFlow runs as one kernel share a group."""

from kerasflow.planner.ir.graphtables import FUSED_GROUP
from kerasflow.profiling.capture import CapturedOp, _fusion_groups


def op(name, kind, inputs=(), layer="dense", phase="forward", colocation=None):
    return CapturedOp(name=name, type=kind, inputs=[(source, 0) for source in inputs], control_inputs=[],
                      output_bytes=[4.0], output_shapes=[(2,)], layer=layer, phase=phase, colocation=colocation)


def groups(ops):
    _fusion_groups(ops)
    return {o.name: o.colocation for o in ops}


def test_a_matmul_with_its_bias_and_activation_is_one_group():
    found = groups([op("x", "Placeholder", layer=None), op("mm", "MatMul", ["x"]), op("bias", "BiasAdd", ["mm"]),
                    op("relu", "Relu", ["bias"]), op("out", "Identity", ["relu"])])
    assert found == {"x": None, "mm": f"{FUSED_GROUP}/mm", "bias": f"{FUSED_GROUP}/mm",
                     "relu": f"{FUSED_GROUP}/mm", "out": None}


def test_a_chain_read_twice_in_the_middle_stops_there():
    # The bias' output is read by the activation and by another op: TensorFlow cannot fuse past it.
    found = groups([op("mm", "MatMul"), op("bias", "BiasAdd", ["mm"]), op("relu", "Relu", ["bias"]),
                    op("other", "Identity", ["bias"])])
    assert found == {"mm": f"{FUSED_GROUP}/mm", "bias": f"{FUSED_GROUP}/mm", "relu": None, "other": None}


def test_a_normalization_a_residual_add_and_the_activation_across_layers_are_one_group():
    found = groups([op("norm", "FusedBatchNormV3", layer="bn"), op("add", "AddV2", ["norm"], layer="add"),
                    op("relu", "Relu", ["add"], layer="re_lu")])
    assert set(found.values()) == {f"{FUSED_GROUP}/norm"}


def test_a_tree_of_additions_is_one_group():
    found = groups([op("a", "AddV2", layer="bn"), op("b", "AddV2", ["a"], layer="add"),
                    op("c", "Add", ["b"], layer=None), op("d", "Mul", ["c"], layer=None)])
    assert found == {"a": f"{FUSED_GROUP}/a", "b": f"{FUSED_GROUP}/a", "c": f"{FUSED_GROUP}/a", "d": None}


def test_a_gradient_product_and_the_optimizer_product_that_reads_it_are_one_group():
    # SGD's learning_rate * gradient, where the gradient is itself a product: Grappler multiplies
    # the scalar in first, but only with both on one device. The update's subtraction stays apart.
    found = groups([op("dgamma", "Mul", phase="backward", layer="bn"),
                    op("lr", "ReadVariableOp", layer=None, phase="update", colocation="sgd/learning_rate"),
                    op("step", "Mul", ["dgamma", "lr"], layer="bn", phase="update"),
                    op("assign", "AssignSubVariableOp", ["step"], layer="bn", phase="update", colocation="bn/gamma")])
    assert found == {"dgamma": f"{FUSED_GROUP}/dgamma", "step": f"{FUSED_GROUP}/dgamma",
                     "lr": "sgd/learning_rate", "assign": "bn/gamma"}


def test_a_product_read_twice_is_not_regrouped():
    found = groups([op("a", "Mul"), op("b", "Mul", ["a"]), op("c", "Mul", ["a"])])
    assert found == {"a": None, "b": None, "c": None}


def test_a_filter_gradient_and_its_bias_gradient_are_one_group():
    found = groups([op("dy", "ReluGrad", phase="backward", layer="conv"),
                    op("filter", "Conv2DBackpropFilter", ["dy"], phase="backward", layer="conv"),
                    op("bias", "BiasAddGrad", ["dy"], phase="backward", layer="conv")])
    assert found == {"dy": None, "filter": f"{FUSED_GROUP}/filter", "bias": f"{FUSED_GROUP}/filter"}


def test_an_op_in_a_variable_group_stays_there():
    found = groups([op("mm", "MatMul", colocation="dense/kernel"), op("bias", "BiasAdd", ["mm"]),
                    op("relu", "Relu", ["bias"])])
    assert found == {"mm": "dense/kernel", "bias": f"{FUSED_GROUP}/bias", "relu": f"{FUSED_GROUP}/bias"}
