"""Small policies with known behaviour, written by hand (nothing is trained).

- CartPole: push toward where the pole falls, a linear rule on (x_dot, theta,
  theta_dot) that balances every seeded episode for the full 500 steps.
- Pendulum: energy pumping far from the top, a PD controller near it, blended
  by a sigmoid of cos(theta); swings up from any start (mean return about -145
  over seeds 0..9, close to a trained TD3's).
- Recurrent: a one-unit state that toggles each step; the action is the state,
  so actions alternate 0, 1, 0, 1 only if the runner carries the state.
- Goal seeker: a PD controller for tests/goal_env.py's point mass, fed by its Dict
  observation (one input per key) and a step-count state that holds the first action at 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# action = 1 (push right) when x_dot*0.1 + theta + 0.5*theta_dot > 0
CARTPOLE_GAINS = (0.0, 0.1, 1.0, 0.5)
# the same rule with a weaker theta_dot gain: it still balances, but decides differently on some states
PERTURBED_GAINS = (0.0, 0.1, 1.0, 0.3)
PENDULUM_GAINS = {"pump": 1.0, "kp": 10.0, "kd": 2.0, "blend": 20.0, "near_top": 0.8}


def _save(graph: onnx.GraphProto, path: Path, metadata: dict[str, str]) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="policy-matrix-tests")
    model.ir_version = 8
    helper.set_model_props(model, metadata)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def cartpole_action(observation: np.ndarray, gains=CARTPOLE_GAINS) -> int:
    """The controller in NumPy, to predict what the ONNX graph must do."""
    return int(np.dot(np.asarray(observation, dtype=np.float64), gains) > 0)


def cartpole(path: Path, gains=CARTPOLE_GAINS) -> Path:
    """obs[B,4] -> scores [-s, s] (Gemm) -> ArgMax -> action[B] int64."""
    weights = np.array([[-g for g in gains], list(gains)], dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["obs", "w", "b"], ["scores"], name="scores", transB=1),
            helper.make_node("ArgMax", ["scores"], ["action"], name="greedy", axis=1, keepdims=0),
        ],
        "cartpole_controller",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.zeros(2, np.float32), "b")],
    )
    return _save(graph, path, {"action_space": "discrete", "action_n": "2"})


def pendulum(path: Path) -> Path:
    """obs[B,3] = (cos, sin, theta_dot) -> torque[B,1] in [-2, 2].

    energy E = theta_dot^2 / 2 + 15 cos(theta) (15 at the top); pump = tanh(k theta_dot (15 - E));
    pd = -(kp sin + kd theta_dot); w = sigmoid(blend (cos - near_top)); action = 2 tanh(pump + w (pd - pump)).
    """
    k = PENDULUM_GAINS
    column = lambda *v: np.array(v, dtype=np.float32).reshape(3, 1)  # noqa: E731
    inits = {
        "pick_cos": column(1, 0, 0), "pick_theta_dot": column(0, 0, 1), "pd_gains": column(0, -k["kp"], -k["kd"]),
        "blend_gain": column(k["blend"], 0, 0), "blend_bias": np.array([-k["blend"] * k["near_top"]], np.float32),
        "half": np.array([0.5], np.float32), "g15": np.array([15.0], np.float32),
        "pump_gain": np.array([k["pump"]], np.float32), "max_torque": np.array([2.0], np.float32),
    }
    node = helper.make_node
    nodes = [
        node("MatMul", ["obs", "pick_cos"], ["cos"]), node("MatMul", ["obs", "pick_theta_dot"], ["theta_dot"]),
        node("Mul", ["theta_dot", "theta_dot"], ["td2"]), node("Mul", ["td2", "half"], ["kinetic"]),
        node("Mul", ["cos", "g15"], ["potential"]), node("Add", ["kinetic", "potential"], ["energy"]),
        node("Sub", ["g15", "energy"], ["missing"]), node("Mul", ["theta_dot", "missing"], ["pump_in"]),
        node("Mul", ["pump_in", "pump_gain"], ["pump_scaled"]), node("Tanh", ["pump_scaled"], ["pump"]),
        node("MatMul", ["obs", "pd_gains"], ["pd"]),
        node("MatMul", ["obs", "blend_gain"], ["blend_raw"]), node("Add", ["blend_raw", "blend_bias"], ["blend_in"]),
        node("Sigmoid", ["blend_in"], ["near_top"]),
        node("Sub", ["pd", "pump"], ["pd_minus_pump"]), node("Mul", ["near_top", "pd_minus_pump"], ["correction"]),
        node("Add", ["pump", "correction"], ["command"]), node("Tanh", ["command"], ["squashed"]),
        node("Mul", ["squashed", "max_torque"], ["action"]),
    ]
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}_{i}"
    graph = helper.make_graph(
        nodes, "pendulum_controller",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    return _save(graph, path, {"action_space": "continuous", "action_low": "-2.0", "action_high": "2.0"})


def recurrent_toggle(path: Path) -> Path:
    """obs[B,4], h_in[B,1] -> action[B] = (h_in > 0.5), h_out = 1 - h_in."""
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["one", "h_in"], ["h_out"], name="toggle"),
            helper.make_node("Greater", ["h_in", "half"], ["is_on"], name="is_on"),
            helper.make_node("Cast", ["is_on"], ["on_int"], name="as_int", to=TensorProto.INT64),
            helper.make_node("Squeeze", ["on_int", "axis1"], ["action"], name="per_sample"),
        ],
        "recurrent_toggle",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "one"),
         numpy_helper.from_array(np.array([0.5], np.float32), "half"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")],
    )
    return _save(graph, path, {"action_space": "discrete", "action_n": "2"})


GOAL_GAINS = {"kp": 4.0, "kd": 4.0}


def goal_seeker(path: Path) -> Path:
    """observation[B,4] (x, y, vx, vy), achieved_goal[B,2], desired_goal[B,2], h_in[B,1] ->
    action[B,2] = clip(kp (desired - achieved) - kd velocity, -1, 1) * min(h_in, 1), h_out = h_in + 1:
    the first action of an episode is 0, every later one pushes to the goal, only if the runner carries the state."""
    inits = {
        "pick_velocity": np.array([[0, 0], [0, 0], [1, 0], [0, 1]], np.float32),
        "kp": np.array([GOAL_GAINS["kp"]], np.float32), "kd": np.array([GOAL_GAINS["kd"]], np.float32),
        "one": np.array([1.0], np.float32), "low": np.array(-1.0, np.float32), "high": np.array(1.0, np.float32),
    }
    node = helper.make_node
    nodes = [
        node("Sub", ["desired_goal", "achieved_goal"], ["error"]), node("Mul", ["error", "kp"], ["pull"]),
        node("MatMul", ["observation", "pick_velocity"], ["velocity"]), node("Mul", ["velocity", "kd"], ["damping"]),
        node("Sub", ["pull", "damping"], ["command"]), node("Clip", ["command", "low", "high"], ["bounded"]),
        node("Min", ["h_in", "one"], ["started"]), node("Mul", ["bounded", "started"], ["action"]),
        node("Add", ["h_in", "one"], ["h_out"]),
    ]
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}_{i}"
    graph = helper.make_graph(
        nodes, "goal_seeker",
        [helper.make_tensor_value_info("observation", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("achieved_goal", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("desired_goal", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    return _save(graph, path, {"action_space": "continuous", "action_low": "-1.0", "action_high": "1.0"})


def pendulum_with_flag(path: Path) -> Path:
    """The pendulum controller beside a rank-0 bool `deterministic` (as torch.onnx.export writes an actor's flag):
    true -> its torque (swings up), false -> no torque at all (hangs). What the flag is fed decides the return."""
    controller = onnx.load(str(pendulum(path)))
    graph = controller.graph
    for node in graph.node:
        node.output[:] = ["torque" if name == "action" else name for name in node.output]
    graph.input.append(helper.make_tensor_value_info("deterministic", TensorProto.BOOL, []))
    graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "no_torque"))
    graph.node.append(helper.make_node("Where", ["deterministic", "torque", "no_torque"], ["action"], name="flagged"))
    return _save(graph, path, {"action_space": "continuous", "action_low": "-2.0", "action_high": "2.0"})
