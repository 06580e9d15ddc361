"""Policies built the way real exporters build them, for regression tests of the tool's own steps.

Each builder returns an `onnx.ModelProto` (checked with the full checker) shaped like
an export seen in the wild: SB3's Min/Max action clip, jax2onnx's Gemm + separate Add,
a recurrent cell with its hidden state as a second input/output, a side input beside
`obs`, names that carry markup, a NaN in a weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, inits, metadata=None, name="policy", opset=OPSET, ir_version=8) -> onnx.ModelProto:
    for index, node in enumerate(nodes):  # exporters name their nodes (torch: "/actor/Gemm")
        node.name = node.name or f"/policy/{node.op_type}_{index}"
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = ir_version
    helper.set_model_props(model, metadata or {})
    onnx.checker.check_model(model, full_check=True)
    return model


def _weights(rng, name: str, fan_in: int, fan_out: int, scale: float = 1.0):
    weight = (scale * rng.normal(0, 1 / np.sqrt(fan_in), size=(fan_in, fan_out))).astype(np.float32)
    bias = rng.normal(0, 0.1, size=(fan_out,)).astype(np.float32)
    return [numpy_helper.from_array(weight, f"{name}_w"), numpy_helper.from_array(bias, f"{name}_b")]


def _float(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def minmax_clip_mlp() -> onnx.ModelProto:
    """SB3 Pendulum style: Gemm/Tanh MLP, then Min/Max clip of the action to [-2, 2]; no metadata."""
    rng = np.random.default_rng(3)
    inits = _weights(rng, "fc0", 3, 64) + _weights(rng, "fc1", 64, 64) + _weights(rng, "head", 64, 1, scale=4.0)
    inits += [numpy_helper.from_array(np.array([2.0], np.float32), "high"), numpy_helper.from_array(np.array([-2.0], np.float32), "low")]
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0_w", "fc0_b"], ["h0"]), helper.make_node("Tanh", ["h0"], ["a0"]),
        helper.make_node("Gemm", ["a0", "fc1_w", "fc1_b"], ["h1"]), helper.make_node("Tanh", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "head_w", "head_b"], ["raw"]),
        helper.make_node("Min", ["raw", "high"], ["clipped_high"]),
        helper.make_node("Max", ["clipped_high", "low"], ["action"]),
    ]
    return _model(nodes, [_float("obs", ["batch", 3])], [_float("action", ["batch", 1])], inits)


def td3_actor(low: float = -0.3, high: float = 0.7) -> onnx.ModelProto:
    """A TD3/SAC actor as torch.onnx.export(dynamo=True) writes `clamp(low + 0.5 * (tanh(mlp(obs)) + 1) * (high - low),
    low, high)`: opset 20, the scalar constants as initializers, one of them (low) shared by the Add and the Clip."""
    rng = np.random.default_rng(11)
    inits = _weights(rng, "fc0", 3, 64) + _weights(rng, "head", 64, 1, scale=8.0)  # saturates on large observations
    inits += [numpy_helper.from_array(np.array(value, np.float32), name)
              for name, value in (("val_0", 1.0), ("val_1", 0.5 * (high - low)), ("val_3", low), ("val_5", high))]
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0_w", "fc0_b"], ["linear"], name="node_linear"),
        helper.make_node("Relu", ["linear"], ["relu"], name="node_relu"),
        helper.make_node("Gemm", ["relu", "head_w", "head_b"], ["linear_1"], name="node_linear_1"),
        helper.make_node("Tanh", ["linear_1"], ["tanh"], name="node_tanh"),
        helper.make_node("Add", ["tanh", "val_0"], ["add_12"], name="node_add_12"),
        helper.make_node("Mul", ["add_12", "val_1"], ["mul_7"], name="node_mul_7"),
        helper.make_node("Add", ["mul_7", "val_3"], ["add_22"], name="node_add_22"),
        helper.make_node("Clip", ["add_22", "val_3", "val_5"], ["action"], name="node_clamp"),
    ]
    return _model(nodes, [_float("obs", ["batch", 3])], [_float("action", ["batch", 1])], inits, opset=20, ir_version=10)


def rescaled_hidden_layer() -> onnx.ModelProto:
    """A tanh MLP whose hidden layer is scaled by 2e4 and back by 5e-5 between its two layers (a unit change folded
    into the graph as `x * 20000.0`), its dense layers as jax2onnx writes them (MatMul + Add): float16 holds both
    constants, and 2e4 * tanh(...) stays below its largest value, 65504, so the model in float16 drifts ~5e-4."""
    rng = np.random.default_rng(9)
    inits = _weights(rng, "fc0", 4, 8) + _weights(rng, "head", 8, 2)
    inits += [numpy_helper.from_array(np.array(2e4, np.float32), "up"), numpy_helper.from_array(np.array(5e-5, np.float32), "down")]
    nodes = [
        helper.make_node("MatMul", ["obs", "fc0_w"], ["xw"]), helper.make_node("Add", ["xw", "fc0_b"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("Mul", ["t", "up"], ["big"], name="/policy/scale_up"),
        helper.make_node("Mul", ["big", "down"], ["back"], name="/policy/scale_down"),
        helper.make_node("MatMul", ["back", "head_w"], ["bw"]), helper.make_node("Add", ["bw", "head_b"], ["action"]),
    ]
    return _model(nodes, [_float("obs", ["batch", 4])], [_float("action", ["batch", 2])], inits)


def unsquashed_gaussian_mean() -> onnx.ModelProto:
    """SB3's documented PPO export on Pendulum: the actor's Gaussian mean, unsquashed (SB3 clips to the action space
    in Python, outside the graph), with the env's [-2, 2] written into the metadata by its user: the float64
    reference leaves the bounds the model states on many observations, whatever runtime runs it."""
    rng = np.random.default_rng(5)
    inits = _weights(rng, "fc0", 3, 64) + _weights(rng, "head", 64, 1, scale=8.0)
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0_w", "fc0_b"], ["h0"]), helper.make_node("Tanh", ["h0"], ["a0"]),
        helper.make_node("Gemm", ["a0", "head_w", "head_b"], ["action"]),
    ]
    metadata = {"action_space": "continuous", "action_low": "-2", "action_high": "2"}
    return _model(nodes, [_float("obs", ["batch", 3])], [_float("action", ["batch", 1])], inits, metadata)


def ppo_guide_value_first() -> onnx.ModelProto:
    """SB3's export guide's call (input_names=["input"], no output names, batch 1) with the legacy exporter, on an
    actor-critic whose forward returns (value, action, log_prob): torch names the outputs after their producers."""
    rng = np.random.default_rng(13)
    inits = _weights(rng, "pi", 3, 1) + _weights(rng, "vf", 3, 1, scale=100.0)
    inits += [numpy_helper.from_array(np.array([-1.4189385], np.float32), "log_prob_const")]
    nodes = [
        helper.make_node("Gemm", ["input", "vf_w", "vf_b"], ["17"]),
        helper.make_node("Gemm", ["input", "pi_w", "pi_b"], ["onnx::Sub_12"]),
        helper.make_node("Identity", ["log_prob_const"], ["29"]),
    ]
    return _model(nodes, [_float("input", [1, 3])],
                  [_float("17", [1, 1]), _float("onnx::Sub_12", [1, 1]), _float("29", [1])], inits)


def gru_cell() -> onnx.ModelProto:
    """(obs, h) -> (action, h_next): a GRU-style cell from Gemm/Sigmoid/Tanh/Mul/Add/Sub."""
    rng = np.random.default_rng(5)
    obs_n, hidden = 6, 16
    inits = []
    for gate in ("z", "r", "n"):
        inits += _weights(rng, f"x{gate}", obs_n, hidden) + _weights(rng, f"h{gate}", hidden, hidden)
    inits += _weights(rng, "head", hidden, 2)
    inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = []
    for gate, act in (("z", "Sigmoid"), ("r", "Sigmoid")):
        nodes += [
            helper.make_node("Gemm", ["obs", f"x{gate}_w", f"x{gate}_b"], [f"gx{gate}"]),
            helper.make_node("Gemm", ["h", f"h{gate}_w", f"h{gate}_b"], [f"gh{gate}"]),
            helper.make_node("Add", [f"gx{gate}", f"gh{gate}"], [f"s{gate}"]),
            helper.make_node(act, [f"s{gate}"], [gate]),
        ]
    nodes += [
        helper.make_node("Gemm", ["obs", "xn_w", "xn_b"], ["gxn"]),
        helper.make_node("Gemm", ["h", "hn_w", "hn_b"], ["ghn"]),
        helper.make_node("Mul", ["r", "ghn"], ["rghn"]),
        helper.make_node("Add", ["gxn", "rghn"], ["sn"]),
        helper.make_node("Tanh", ["sn"], ["n"]),
        helper.make_node("Sub", ["one", "z"], ["one_minus_z"]),
        helper.make_node("Mul", ["one_minus_z", "n"], ["keep_new"]),
        helper.make_node("Mul", ["z", "h"], ["keep_old"]),
        helper.make_node("Add", ["keep_new", "keep_old"], ["h_next"]),
        helper.make_node("Gemm", ["h_next", "head_w", "head_b"], ["head"]),
        helper.make_node("Tanh", ["head"], ["action"]),
    ]
    return _model(
        nodes, [_float("obs", ["batch", obs_n]), _float("h", ["batch", hidden])],
        [_float("action", ["batch", 2]), _float("h_next", ["batch", hidden])], inits,
    )


def side_input_policy() -> onnx.ModelProto:
    """obs [batch, 8] beside rng [1]: a second runtime input that is not a batch."""
    rng = np.random.default_rng(7)
    inits = _weights(rng, "fc", 8, 2)
    nodes = [
        helper.make_node("Gemm", ["obs", "fc_w", "fc_b"], ["mean"]),
        helper.make_node("Mul", ["rng", "mean"], ["scaled"]),  # [1] broadcasts over [batch, 2]
        helper.make_node("Tanh", ["scaled"], ["action"]),
    ]
    return _model(nodes, [_float("obs", ["batch", 8]), _float("rng", [1])], [_float("action", ["batch", 2])], inits)


def gemm_add_mlp(opset: int = OPSET, ir_version: int = 8) -> onnx.ModelProto:
    """jax2onnx style: Gemm without a bias, then a separate Add, weights as Constant nodes
    (not initializers), which ORT's dynamic quantization cannot see: it quantizes nothing."""
    rng = np.random.default_rng(11)
    weights = _weights(rng, "fc0", 8, 32) + _weights(rng, "fc1", 32, 4)
    inits = []
    nodes = [helper.make_node("Constant", [], [tensor.name], value=tensor) for tensor in weights]
    nodes += [
        helper.make_node("Gemm", ["obs", "fc0_w"], ["m0"]), helper.make_node("Add", ["m0", "fc0_b"], ["h0"]),
        helper.make_node("Relu", ["h0"], ["a0"]),
        helper.make_node("Gemm", ["a0", "fc1_w"], ["m1"]), helper.make_node("Add", ["m1", "fc1_b"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["action"]),
    ]
    return _model(nodes, [_float("obs", ["batch", 8])], [_float("action", ["batch", 4])], inits, opset=opset,
                  ir_version=ir_version)


def jax2onnx_default_mlp() -> onnx.ModelProto:
    """As jax2onnx writes it by default: opset 23 with IR 10. onnxruntime refuses opset 23 before 1.23.0
    (measured: 1.21.0, 1.21.1, 1.22.0 and 1.22.1 fail to load it, "Opset 23 is under development"; 1.23.0 runs it)."""
    return gemm_add_mlp(opset=23, ir_version=10)


def close_call_discrete() -> onnx.ModelProto:
    """A discrete MatMul MLP whose logits sit close together: int8 flips actions with margins above 1e-3."""
    rng = np.random.default_rng(13)
    inits = _weights(rng, "fc0", 4, 64)
    first = rng.normal(0, 1, size=(64, 1))
    close = np.hstack([first, first + rng.normal(0, 0.1, size=(64, 1))]).astype(np.float32)  # two near-twin actions
    inits += [numpy_helper.from_array(close, "head_w"), numpy_helper.from_array(np.zeros(2, np.float32), "head_b")]
    nodes = [
        helper.make_node("MatMul", ["obs", "fc0_w"], ["m0"]), helper.make_node("Add", ["m0", "fc0_b"], ["h0"]),
        helper.make_node("Tanh", ["h0"], ["a0"]),
        helper.make_node("MatMul", ["a0", "head_w"], ["m1"]), helper.make_node("Add", ["m1", "head_b"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0),
    ]
    action = helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])
    return _model(nodes, [_float("obs", ["batch", 4])], [action], inits,
                  {"action_space": "discrete", "action_n": "2"})


def cast_action_discrete() -> onnx.ModelProto:
    """A discrete MLP whose action is ArgMax then Cast to int64, as torch writes SB3's CartPole action
    (ArgMax -> Cast -> Reshape): tract types every Cast to int64 as its TDim."""
    return _argmax_mlp(seed=5, logits=3, action_n=3, cast=True)


def argmax_over_more_logits_than_action_n() -> onnx.ModelProto:
    """A Q-network's ArgMax over 4 logits whose metadata says action_n = 3 (a user's wrong count, or a head exported
    for another env): the float64 reference returns index 3 on many observations, whatever runtime runs it."""
    return _argmax_mlp(seed=7, logits=4, action_n=3)


def _argmax_mlp(seed: int, logits: int, action_n: int, cast: bool = False) -> onnx.ModelProto:
    """Gemm -> Tanh -> Gemm -> ArgMax over `logits` (then Cast to int64 where `cast`), action_n in the metadata."""
    rng = np.random.default_rng(seed)
    inits = _weights(rng, "fc0", 4, 32) + _weights(rng, "head", 32, logits)
    nodes = [
        helper.make_node("Gemm", ["obs", "fc0_w", "fc0_b"], ["h0"]), helper.make_node("Tanh", ["h0"], ["a0"]),
        helper.make_node("Gemm", ["a0", "head_w", "head_b"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["index" if cast else "action"], axis=1, keepdims=0),
        *([helper.make_node("Cast", ["index"], ["action"], to=TensorProto.INT64)] if cast else []),
    ]
    action = helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])
    return _model(nodes, [_float("obs", ["batch", 4])], [action], inits,
                  {"action_space": "discrete", "action_n": str(action_n)})


def markup_names_mlp() -> onnx.ModelProto:
    """Valid ONNX whose input, tensor and node names carry HTML: onnx2tf writes its float
    files, but no SavedModel (so no signature, and no int8 from it)."""
    rng = np.random.default_rng(17)
    weight, bias = _weights(rng, "fc", 5, 3)
    weight.name, bias.name = "<b>W</b>", "bias&<i>"
    obs = "_obs&<i>"
    nodes = [
        helper.make_node("Gemm", [obs, weight.name, bias.name], ["<script>h</script>"], name="<img src=x>"),
        helper.make_node("Tanh", ["<script>h</script>"], ["action"], name="tanh&\"q\""),
    ]
    return _model(nodes, [_float(obs, ["batch", 5])], [_float("action", ["batch", 3])], [weight, bias])


def nan_initializer_mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(19)
    weight, bias = _weights(rng, "W1", 4, 2)
    values = numpy_helper.to_array(weight).copy()
    values[0, 0] = np.nan
    nodes = [helper.make_node("Gemm", ["obs", "W1_w", "W1_b"], ["h"]), helper.make_node("Tanh", ["h"], ["action"])]
    return _model(nodes, [_float("obs", ["batch", 4])], [_float("action", ["batch", 2])],
                  [numpy_helper.from_array(values, "W1_w"), bias])


def lstm_actor(obs_n: int = 105, hidden: int = 128, actions: int = 12, batch: str | int = "batch") -> onnx.ModelProto:
    """rsl_rl's LSTM actor as its exporter writes it: obs [batch, 105], h_in/c_in [1, batch, 128]
    (the ONNX LSTM layout [num_layers, batch, hidden]: the batch on axis 1) -> actions, h_out, c_out.
    `batch=1`: the fixed batch rsl_rl's exporter writes."""
    rng = np.random.default_rng(11)
    scale = 1 / np.sqrt(hidden)
    inits = [
        numpy_helper.from_array(rng.uniform(-scale, scale, (1, 4 * hidden, obs_n)).astype(np.float32), "lstm_w"),
        numpy_helper.from_array(rng.uniform(-scale, scale, (1, 4 * hidden, hidden)).astype(np.float32), "lstm_r"),
        numpy_helper.from_array(rng.uniform(-scale, scale, (1, 8 * hidden)).astype(np.float32), "lstm_b"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([0, 1], np.int64), "axes01"),
        *_weights(rng, "head", hidden, actions),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["obs", "axis0"], ["sequence"]),  # one step: [1, batch, 105]
        helper.make_node("LSTM", ["sequence", "lstm_w", "lstm_r", "lstm_b", "", "h_in", "c_in"], ["y", "h_out", "c_out"],
                         hidden_size=hidden, name="/memory/rnn/LSTM"),
        helper.make_node("Squeeze", ["y", "axes01"], ["features"]),
        helper.make_node("Gemm", ["features", "head_w", "head_b"], ["actions"], name="/actor/Gemm"),
    ]
    return _model(
        nodes, [_float("obs", [batch, obs_n]), _float("h_in", [1, batch, hidden]), _float("c_in", [1, batch, hidden])],
        [_float("actions", [batch, actions]), _float("h_out", [1, batch, hidden]), _float("c_out", [1, batch, hidden])],
        inits,
    )


def vad_with_sample_rate(samples: int = 64, hidden: int = 128) -> onnx.ModelProto:
    """silero-vad's interface: input [?, 64], state [2, ?, 128] (h and c stacked on axis 0, the batch on
    axis 1), a rank-0 int64 `sr` -> output [?, 1], stateN; dims left unnamed as that export does."""
    rng = np.random.default_rng(13)
    inits = [
        *_weights(rng, "x", samples, hidden), *_weights(rng, "h", hidden, hidden), *_weights(rng, "out", hidden, 1),
        numpy_helper.from_array(np.array(16000.0, np.float32), "rate16k"),
        numpy_helper.from_array(np.array(0, np.int64), "first"), numpy_helper.from_array(np.array(1, np.int64), "second"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("Cast", ["sr"], ["sr_float"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["sr_float", "rate16k"], ["rate_scale"]),  # rank 0 broadcasts over [batch, 64]
        helper.make_node("Mul", ["input", "rate_scale"], ["scaled"]),
        helper.make_node("Gather", ["state", "first"], ["h"], axis=0),
        helper.make_node("Gather", ["state", "second"], ["c"], axis=0),
        helper.make_node("Gemm", ["scaled", "x_w", "x_b"], ["from_input"]),
        helper.make_node("Gemm", ["h", "h_w", "h_b"], ["from_state"]),
        helper.make_node("Add", ["from_input", "from_state"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_next"]),
        helper.make_node("Add", ["c", "h_next"], ["c_next"]),
        helper.make_node("Unsqueeze", ["h_next", "axis0"], ["h_row"]),
        helper.make_node("Unsqueeze", ["c_next", "axis0"], ["c_row"]),
        helper.make_node("Concat", ["h_row", "c_row"], ["stateN"], axis=0),
        helper.make_node("Gemm", ["h_next", "out_w", "out_b"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["output"]),
    ]
    inputs = [_float("input", [None, samples]), _float("state", [2, None, hidden]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])]
    return _model(nodes, inputs, [_float("output", [None, 1]), _float("stateN", [2, None, hidden])], inits)


def unnamed_batch_regressor() -> onnx.ModelProto:
    """skl2onnx's MLPRegressor shape: float_input [?, 3] with an unnamed batch -> variable [?, 1]."""
    rng = np.random.default_rng(17)
    inits = _weights(rng, "l1", 3, 8) + _weights(rng, "l2", 8, 1)
    nodes = [
        helper.make_node("MatMul", ["float_input", "l1_w"], ["h1"]), helper.make_node("Add", ["h1", "l1_b"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "l2_w"], ["h2"]), helper.make_node("Add", ["h2", "l2_b"], ["variable"]),
    ]
    return _model(nodes, [_float("float_input", [None, 3])], [_float("variable", [None, 1])], inits)


def zipmap_classifier() -> onnx.ModelProto:
    """skl2onnx's classifier default: output_label [?] int64 and output_probability, a ZipMap's sequence of
    maps (what `options={id(clf): {"zipmap": False}}` turns into a [?, 3] tensor)."""
    rng = np.random.default_rng(19)
    weights = rng.normal(size=(3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("LinearClassifier", ["float_input"], ["label", "probability_tensor"], domain="ai.onnx.ml",
                         classlabels_ints=[0, 1, 2], coefficients=weights.ravel().tolist(), intercepts=[0.1, -0.2, 0.0],
                         multi_class=1, post_transform="SOFTMAX"),
        helper.make_node("Identity", ["label"], ["output_label"]),
        helper.make_node("ZipMap", ["probability_tensor"], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]),
    ]
    probabilities = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    zipped = helper.make_value_info("output_probability", helper.make_sequence_type_proto(probabilities))
    graph = helper.make_graph(nodes, "classifier", [_float("float_input", [None, 4])],
                              [helper.make_tensor_value_info("output_label", TensorProto.INT64, [None]), zipped])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 1)],
                              producer_name="skl2onnx")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model: onnx.ModelProto, folder: Path, name: str) -> Path:
    path = Path(folder) / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def discrete_observation_looked_up(lookup: str = "Gather", rows: int = 10) -> onnx.ModelProto:
    """A discrete observation (a grid cell, an entity type) looked up before the actor, as torch writes it: an
    `nn.Embedding(rows, 8)` is Gather(weight, cell) with both exporters, `F.one_hot(cell, rows)` is a OneHot; then
    Concat with a continuous obs [N, 4] -> Gemm -> Tanh. cell is int64 [N]."""
    rng = np.random.default_rng(9)
    if lookup == "Gather":
        looked_up = [helper.make_node("Gather", ["emb.weight", "cell"], ["embedded"])]
        tables = [numpy_helper.from_array(rng.standard_normal((rows, 8)).astype(np.float32), "emb.weight")]
        width = 8
    else:
        looked_up = [helper.make_node("OneHot", ["cell", "depth", "off_on"], ["hot"], axis=-1),
                     helper.make_node("Cast", ["hot"], ["embedded"], to=TensorProto.FLOAT)]
        tables = [numpy_helper.from_array(np.array(rows, np.int64), "depth"), numpy_helper.from_array(np.array([0, 1], np.int64), "off_on")]
        width = rows
    nodes = [*looked_up, helper.make_node("Concat", ["embedded", "obs"], ["both"], axis=1),
             helper.make_node("Gemm", ["both", "head_w", "head_b"], ["head"]), helper.make_node("Tanh", ["head"], ["action"])]
    inputs = [helper.make_tensor_value_info("cell", TensorProto.INT64, ["batch"]), _float("obs", ["batch", 4])]
    return _model(nodes, inputs, [_float("action", ["batch", 2])], [*tables, *_weights(rng, "head", width + 4, 2)])


def pixels_scaled_in_graph(scale_op: str = "Mul", divisor: float = 255.0, affine: str = "") -> onnx.ModelProto:
    """A pixel actor that takes float32 pixels and scales them first, as torch exports `obs * (1 / 255)` (Mul) or
    SB3's `obs.float() / 255` (Cast, then Div), by `divisor` (127.5: `x / 127.5 - 1` to [-1, 1]), then an `affine`:
    "minus 1" or torchvision's per-channel "normalize" (`(x - mean) / std`): obs [N, 3, 8, 8] -> scale -> affine ->
    Flatten -> Gemm -> Tanh."""
    rng = np.random.default_rng(8)
    scale = np.float32(1 / divisor) if scale_op == "Mul" else np.float32(divisor)
    affines = {
        "": ([], {}),
        "minus 1": ([helper.make_node("Sub", ["unit", "one"], ["centred"])], {"one": np.float32(1)}),
        "normalize": ([helper.make_node("Sub", ["unit", "mean"], ["shifted"]), helper.make_node("Div", ["shifted", "std"], ["centred"])],
                      {"mean": np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1),
                       "std": np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)}),
    }
    affine_nodes, affine_constants = affines[affine]
    nodes = [
        helper.make_node("Cast", ["obs"], ["obs_float"], to=TensorProto.FLOAT),
        helper.make_node(scale_op, ["obs_float", "scale"], ["unit"]),
        *affine_nodes,
        helper.make_node("Flatten", ["centred" if affine_nodes else "unit"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "head_w", "head_b"], ["head"]),
        helper.make_node("Tanh", ["head"], ["action"]),
    ]
    inits = [numpy_helper.from_array(np.array(scale), "scale"), *_weights(rng, "head", 3 * 8 * 8, 2, scale=4.0),
             *(numpy_helper.from_array(np.asarray(value), name) for name, value in affine_constants.items())]
    return _model(nodes, [_float("obs", ["batch", 3, 8, 8])], [_float("action", ["batch", 2])], inits)
