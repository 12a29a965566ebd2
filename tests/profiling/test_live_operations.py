"""``live_operations``: the ops of a traced step TensorFlow runs (the rest it prunes)."""

import tensorflow as tf

from kerasflow.profiling.capture import live_operations


def test_ops_nothing_needs_are_left_out_and_stateful_ops_kept():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0, name="a")
        b = tf.math.square(a, name="b")
        tf.identity(b, name="unread")  # read by nothing, returned by nothing
        v = tf.Variable(2.0, name="v")
        v.assign_add(a, name="update")  # stateful: it runs although nothing reads it
        out = tf.math.sqrt(b, name="out")
    live = {op.name for op in live_operations(graph.get_operations(), [out])}
    assert {"a", "b", "out", "update"} <= live
    assert "unread" not in live
