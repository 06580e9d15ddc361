"""Lints, graph facts and the action contract on small graphs built like real exports."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

import policies
from matrix.errors import InputError
from matrix.inputs import contract, examples
from matrix.inputs.graph_facts import StatePair, action_bounds, non_finite_initializers
from matrix.inputs.lint import lint, reference_bounds
from matrix.judge.rules import Tolerance


def _lints(model) -> dict[str, tuple[str, str]]:
    return {found.id: (found.level, found.message) for found in lint(model)}


# --- graph facts -----------------------------------------------------------------------------------

def test_bounds_come_from_a_final_tanh_a_min_max_clip_or_a_clip(load_policy):
    assert action_bounds(load_policy(examples.continuous_mlp()), "action") == (-1.0, 1.0, "graph: final Tanh")
    assert action_bounds(load_policy(policies.minmax_clip_mlp()), "action") == (-2.0, 2.0, "graph: final Min/Max clip")
    low, high = numpy_helper.from_array(np.array(-3, np.float32), "lo"), numpy_helper.from_array(np.array(3, np.float32), "hi")
    clip = helper.make_graph(
        [helper.make_node("Clip", ["obs", "lo", "hi"], ["c"]), helper.make_node("Identity", ["c"], ["action"])], "clip",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])], [low, high])
    model = helper.make_model(clip, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert action_bounds(load_policy(model), "action") == (-3.0, 3.0, "graph: final Clip")  # through the Identity


def test_no_bounds_where_the_graph_states_none(load_policy):
    assert action_bounds(load_policy(examples.discrete_mlp()), "action") is None
    assert action_bounds(load_policy(policies.close_call_discrete()), "logits") is None


def test_a_recurrent_state_pairs_with_its_next_value_and_a_side_input_does_not(load_policy):
    assert load_policy(policies.gru_cell()).state_pairs == [StatePair("h", "h_next", axis=0)]
    assert load_policy(policies.side_input_policy()).state_pairs == []
    assert load_policy(examples.continuous_mlp()).state_pairs == []


def test_non_finite_initializers_are_counted_by_name(load_policy):
    assert non_finite_initializers(load_policy(policies.nan_initializer_mlp())) == [("W1_w", 1)]
    assert non_finite_initializers(load_policy(examples.pixel_cnn())) == []


# --- lints -----------------------------------------------------------------------------------------

def test_a_clean_policy_has_no_finding(load_policy):
    assert {level for level, _ in _lints(load_policy(examples.continuous_mlp())).values()} == {"ok"}


def test_lints_name_what_they_found(load_policy):
    gru = _lints(load_policy(policies.gru_cell()))
    assert gru["input-obs"] == ("ok", "one observation input named 'obs' (besides recurrent state inputs ['h'])")
    assert gru["recurrent-state"] == ("warn", "recurrent state h -> h_next (batch on axis 0): the caller carries it between steps (checked in the contract)")
    side = _lints(load_policy(policies.side_input_policy()))
    assert side["side-inputs"][0] == "warn" and "['rng']" in side["side-inputs"][1]
    assert side["symbolic-batch"][0] == "ok"  # a side input is fed whole: its fixed dimension is no batch
    assert side["no-training-inputs"][0] == "error" and "['rng']" in side["no-training-inputs"][1]
    assert _lints(load_policy(policies.nan_initializer_mlp()))["finite-weights"] == (
        "error", "initializer W1_w has 1 non-finite value")
    clip = _lints(load_policy(policies.minmax_clip_mlp()))["action-space"]
    assert clip[0] == "warn" and "bounds [-2, 2] inferred from the final Min/Max clip" in clip[1]


def test_an_action_space_of_another_word_is_named_not_called_missing(load_policy):
    """The lint said 'no action_space in the model metadata' beside a declared one, so a user who added it saw
    no change; it names the value, and the keys the contract reads."""
    model = policies.minmax_clip_mlp()
    helper.set_model_props(model, {"action_space": "Box(-2, 2)"})
    level, message = _lints(load_policy(model))["action-space"]
    assert level == "warn" and message.startswith("action_space 'Box(-2, 2)' in the model metadata is neither"), message
    level, message = _lints(load_policy(policies.minmax_clip_mlp()))["action-space"]
    assert "action_low/action_high or action_n" in message, message


def test_random_ops_and_dropout_are_found(load_policy):
    nodes = [helper.make_node("RandomNormalLike", ["obs"], ["noise"], name="explore"),
             helper.make_node("Add", ["obs", "noise"], ["noisy"]),
             helper.make_node("Dropout", ["noisy"], ["action"], name="drop")]
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    found = _lints(load_policy(model))
    assert found["no-random-ops"] == ("error", "random operators make actions non-deterministic: ['RandomNormalLike (explore)']")
    assert found["no-dropout"] == ("warn", "Dropout left in the exported graph: ['drop']")
    assert found["symbolic-batch"][0] == "warn"


# --- the action contract ---------------------------------------------------------------------------

def _arrays(outputs: dict, repeat: dict | None = None, batches: dict | None = None) -> dict:
    arrays = {f"outputs/{k}": v for k, v in outputs.items()}
    arrays |= {f"repeat/{k}": v for k, v in (repeat if repeat is not None else outputs).items()}
    for batch, values in (batches or {}).items():
        arrays |= {f"batch{batch}/{k}": v for k, v in values.items()}
    return arrays


def _checks(model, arrays, reference) -> dict[str, tuple]:
    return {c.name: (c.ok, c.detail) for c in contract.check(model, arrays, reference)}


def _good_batches(width: int, dtype=np.float32) -> dict:
    return {b: {"action": np.zeros((b, width), dtype)} for b in contract.CONTRACT_BATCHES}


def test_a_well_behaved_continuous_policy_passes_every_check(load_policy):
    model = load_policy(examples.continuous_mlp())
    action = np.full((4, 6), 0.5, np.float32)
    checks = _checks(model, _arrays({"action": action}, batches=_good_batches(6)), {"action": action})
    assert all(ok for ok, _ in checks.values()), checks
    assert checks["action bounds"][1] == "[0.5, 0.5] within [-1, 1] (metadata)"


def test_each_broken_promise_is_its_own_failed_check(load_policy):
    model = load_policy(examples.continuous_mlp())
    reference = {"action": np.zeros((4, 6), np.float32)}
    action = np.full((4, 6), 2.0, np.float64)  # out of bounds, wrong dtype
    action[0, 0] = np.nan
    batches = _good_batches(6)
    batches[7] = {"action": np.zeros((1, 6), np.float32)}
    checks = _checks(model, _arrays({"action": action}, repeat={"action": action + 1}, batches=batches), reference)
    assert checks["finite outputs"] == (False, "NaN or Inf in ['action']")
    assert checks["output dtypes"] == (False, "action: float64 (declared float32)")
    assert checks["action bounds"][0] is False and "leaves [-1, 1]" in checks["action bounds"][1]
    assert checks["deterministic"] == (False, "second run differs in ['action']")
    assert checks["batch 1/2/7"] == (False, "batch 7: action shape (1, 6)")
    assert checks["output shapes"][0] is True


def test_a_nan_is_judged_once_by_finite_outputs_not_again_as_leaving_the_bounds(load_policy):
    """Seen: 'action bounds: [-0.5804, 0.3954] leaves [-1, 1]', since every comparison with NaN is false."""
    model = load_policy(examples.continuous_mlp())
    action = np.full((4, 6), 0.5, np.float32)
    action[1, 2] = np.nan
    checks = _checks(model, _arrays({"action": action}, batches=_good_batches(6)), {"action": action})
    assert checks["finite outputs"][0] is False
    assert checks["action bounds"] == (True, "[0.5, 0.5] within [-1, 1] (metadata; 1 non-finite value left to 'finite outputs')")


def test_an_fp16_artifact_is_held_to_the_bounds_float16_can_state(load_policy):
    """Seen: ort-cpu's fp16 cell of a TD3 actor clamped to [-0.3, 0.7] FAILed 'action bounds: [-0.3, 0.7002] leaves
    [-0.3, 0.7]': the fp16 variant's Clip holds 0.7 as 0.70020 (the nearest float16), which onnxruntime returned."""
    model = load_policy(policies.td3_actor())
    saturated = np.array([[np.float16(-0.3)], [np.float16(0.7)]], np.float32)  # what the fp16 graph returns at its bounds
    clipped = {"action": np.array([[-0.3], [0.7]], np.float32).astype(np.float64)}  # the reference, at the Clip's bounds
    arrays = _arrays({"action": saturated}, batches=_good_batches(1))
    assert _checks(model, arrays, clipped)["action bounds"] == (False, "[-0.30005, 0.7002] leaves [-0.3, 0.7] (graph: final Clip)")
    held = contract.check(model, arrays, clipped, "fp16")
    assert {c.name: (c.ok, c.detail) for c in held}["action bounds"] == (
        True, "[-0.30005, 0.7002] within [-0.3, 0.7] as float16 holds them, [-0.30005, 0.7002] (graph: final Clip)")
    beyond = np.array([[0.7007]], np.float32)  # a float16 further out than the bound's own rounding
    checks = {c.name: c.ok for c in contract.check(model, _arrays({"action": beyond}), {"action": clipped["action"][1:]}, "fp16")}
    assert checks["action bounds"] is False
    assert _checks(model, _arrays({"action": saturated}), clipped)["action bounds"][0] is False  # fp32: as before
    inside = np.array([[0.5]], np.float32)  # float16's bounds are said only where a value needed them
    checks = {c.name: c.detail for c in contract.check(model, _arrays({"action": inside}), {"action": inside}, "fp16")}
    assert checks["action bounds"] == "[0.5, 0.5] within [-0.3, 0.7] (graph: final Clip)"


def test_an_action_returned_on_an_integer_grid_is_held_to_half_a_step_beyond_its_bounds(load_policy):
    """LiteRT's full-integer file clipped a TD3 actor at -0.3012 on its int8 grid of step 1/255 and returned -77/255:
    'action bounds: [-0.3019, 0.6941] leaves [-0.3012, 0.6988]' FAILed the cell for the tool's calibrated conversion."""
    model = load_policy(policies.td3_actor(-0.3012, 0.6988))
    on_grid = np.array([[-77 / 255], [178 / 255]], np.float32)

    def bounds(action, steps):
        clipped = {"action": np.clip(action, np.float32(-0.3012), np.float32(0.6988)).astype(np.float64)}  # the reference
        return {c.name: (c.ok, c.detail) for c in contract.check(model, _arrays({"action": action}), clipped,
                                                                    "int8", steps)}["action bounds"]

    assert bounds(on_grid, {})[0] is False
    assert bounds(on_grid, {"action": 1 / 255}) == (True, "[-0.302, 0.698] within [-0.3012, 0.6988] as its integer "
                                                          "output grid (step 0.00392) holds them, [-0.30316, 0.70076] "
                                                          "(graph: final Clip)")
    assert bounds(np.array([[-0.3045]], np.float32), {"action": 1 / 255})[0] is False  # beyond half a step


def test_bounds_the_reference_leaves_too_are_the_model_s_and_the_runtime_is_held_to_the_reference(load_policy):
    """SB3's PPO export with [-2, 2] in its metadata returns the unsquashed mean: every cell FAILed 'action bounds',
    the export's doing. A runtime may leave them only where, and no farther than, the float64 reference does."""
    model = load_policy(policies.unsquashed_gaussian_mean())
    reference = {"action": np.array([[3.0], [-2.5], [1.0], [0.5]])}
    tolerance = Tolerance(atol=1e-3)

    def bounds(action, precision="fp32"):
        checks = contract.check(model, _arrays({"action": np.array(action, np.float32)}), reference, precision,
                                tolerance=tolerance)
        return {c.name: (c.ok, c.detail) for c in checks}["action bounds"]

    said = "reference leaves them too on 2 of 4 observations: the export does not enforce its stated bounds"
    ok, detail = bounds([[3.0005], [-2.5005], [1.0], [0.5]])  # as far as the reference, within tolerance
    assert ok is True and detail.startswith("[-2.5, 3] leaves [-2, 2] (metadata): no farther than the reference") and said in detail
    assert bounds([[3.0], [-2.5], [1.0], [0.5]], "fp16")[0] is True  # and so with the fp16 holding
    ok, detail = bounds([[3.0], [-2.5], [2.1], [0.5]])  # leaves them where the reference keeps them: the runtime's
    assert ok is False and "1 value where the reference keeps them, or farther" in detail and said in detail, detail
    assert bounds([[3.1], [-2.5], [1.0], [0.5]])[0] is False  # farther than the reference, beyond tolerance
    assert bounds([[-3.0], [-2.5], [1.0], [0.5]])[0] is False  # on the other side
    ok, detail = bounds([[2.0], [-2.0], [1.0], [0.5]])  # a runtime within them: said of the reference all the same
    assert ok is True and detail == ("[-2, 2] within [-2, 2] (metadata); the float64 reference leaves them on 2 of 4 "
                                     "observations: the export does not enforce its stated bounds (lint 'action-bounds')")


def test_the_model_s_own_bounds_violation_is_one_lint_for_the_run(load_policy):
    model = load_policy(policies.unsquashed_gaussian_mean())
    leaves = reference_bounds(model, {"action": np.array([[3.0], [-2.5], [1.0], [0.5]])})
    assert (leaves.id, leaves.level) == ("action-bounds", "warn")
    assert leaves.message.startswith("the float64 reference's action leaves [-2, 2] (metadata) on 2 of 4 observations, "
                                     "reaching [-2.5, 3]: the export does not enforce the bounds it states")
    kept = reference_bounds(model, {"action": np.array([[1.5], [-2.0]])})
    assert (kept.level, kept.message) == ("ok", "the float64 reference keeps the action in [-2, 2] (metadata)")
    unstated = policies.unsquashed_gaussian_mean()
    del unstated.metadata_props[:]
    assert reference_bounds(load_policy(unstated), {"action": np.array([[30.0]])}) is None


def test_a_decimal_bound_the_graph_holds_as_float32_is_kept_by_the_reference(load_policy):
    """A TD3 actor clamped at -0.3 with action_low=-0.3 in its metadata: the float64 reference computes with the
    graph's float32 constant and returns -0.30000001, which is the bound as the model holds it, not a violation."""
    proto = policies.td3_actor()
    helper.set_model_props(proto, {"action_space": "continuous", "action_low": "-0.3", "action_high": "0.7"})
    model = load_policy(proto)
    clipped = np.array([[-0.3], [0.7]], np.float32)
    reference = {"action": clipped.astype(np.float64)}
    assert reference_bounds(model, reference).level == "ok"
    checks = {c.name: (c.ok, c.detail) for c in contract.check(model, _arrays({"action": clipped}), reference)}
    assert checks["action bounds"] == (True, "[-0.3, 0.7] within [-0.3, 0.7] (metadata)")


def test_a_missing_output_fails_shapes_dtypes_and_bounds(load_policy):
    model = load_policy(examples.continuous_mlp())
    checks = _checks(model, _arrays({}), {"action": np.zeros((2, 6), np.float32)})
    assert checks["output shapes"] == (False, "action: missing, expected (2, 6)")
    assert checks["output dtypes"] == (False, "action: missing")
    assert checks["action bounds"] == (False, "no action output returned")


def test_discrete_indices_are_checked_against_action_n(load_policy):
    model = load_policy(examples.discrete_mlp())
    inside = np.array([0, 3, 2], np.int64)
    assert _checks(model, _arrays({"action": inside}), {"action": inside})["action bounds"] == (True, "indices in [0, 4)")
    outside = np.array([0, 4, -1], np.int64)
    assert _checks(model, _arrays({"action": outside}), {"action": inside})["action bounds"] == (False, "index outside [0, 4)")


def test_an_index_the_reference_returns_outside_action_n_is_the_model_s_and_the_runtime_is_held_to_it(load_policy):
    """An ArgMax over 4 logits with action_n = 3 in the metadata: the reference returns index 3 too, and every cell of
    every runtime FAILed 'index outside [0, 3)', the model's doing. A runtime may return an index outside [0, n) only
    where it is the reference's own index for that observation."""
    model = load_policy(policies.argmax_over_more_logits_than_action_n())
    reference = {"action": np.array([3, 0, 3, 2], np.int64)}

    def bounds(action):
        checks = contract.check(model, _arrays({"action": np.array(action, np.int64)}), reference,
                                tolerance=Tolerance(atol=1e-3))
        return {c.name: (c.ok, c.detail) for c in checks}["action bounds"]

    said = ("the float64 reference returns indices outside them too on 2 of 4 observations (index 3): the graph has "
            "more actions than its action_n states (lint 'action-bounds')")
    assert bounds([3, 0, 3, 2]) == (True, f"index outside [0, 3): the reference's own index on each; {said}")
    ok, detail = bounds([3, 0, 3, 3])  # index 3 where the reference returns 2: the runtime's
    assert ok is False and detail == f"index outside [0, 3): 1 value not the reference's index there; {said}"
    assert bounds([4, 0, 3, 2])[0] is False  # another index outside where the reference's is: the runtime's
    assert bounds([-1, 0, 3, 2])[0] is False
    ok, detail = bounds([2, 0, 1, 2])  # a runtime within them: said of the reference all the same
    assert ok is True and detail == ("indices in [0, 3); the float64 reference returns indices outside them on 2 of 4 "
                                     "observations (index 3): the graph has more actions than its action_n states "
                                     "(lint 'action-bounds')")


def test_an_index_outside_action_n_in_the_reference_is_one_lint_for_the_run(load_policy):
    model = load_policy(policies.argmax_over_more_logits_than_action_n())
    leaves = reference_bounds(model, {"action": np.array([3, 0, 3, 2, 5], np.int64)})
    assert (leaves.id, leaves.level) == ("action-bounds", "warn")
    assert leaves.message.startswith("the float64 reference returns action indices 3, 5, outside [0, 3) (metadata "
                                     "action_n = 3), on 3 of 5 observations: the graph has more actions than its "
                                     "metadata states"), leaves.message
    assert "correct action_n in the metadata, or the graph's action head" in leaves.message
    kept = reference_bounds(model, {"action": np.array([0, 2, 1], np.int64)})
    assert (kept.level, kept.message) == ("ok", "the float64 reference's action indices lie in [0, 3) (metadata action_n)")
    unstated = policies.argmax_over_more_logits_than_action_n()
    del unstated.metadata_props[:]
    assert reference_bounds(load_policy(unstated), {"action": np.array([7], np.int64)}) is None


def test_bounds_without_metadata_come_from_the_graph_and_say_so(load_policy):
    model = load_policy(policies.minmax_clip_mlp())
    action = np.array([[2.5]], np.float32)
    ok, detail = _checks(model, _arrays({"action": action}), {"action": np.array([[2.0]])})["action bounds"]
    assert ok is False and detail == "[2.5, 2.5] leaves [-2, 2] (graph: final Min/Max clip)"


def test_non_finite_values_the_reference_holds_too_are_allowed_except_in_the_action(load_policy):
    model = load_policy(policies.gru_cell())
    h_next = np.array([[np.inf] * 16], np.float32)
    outputs = {"action": np.zeros((1, 2), np.float32), "h_next": h_next}
    assert _checks(model, _arrays(outputs), dict(outputs))["finite outputs"][0] is True
    outputs["action"] = np.array([[np.inf, 0]], np.float32)
    assert _checks(model, _arrays(outputs), dict(outputs))["finite outputs"] == (False, "NaN or Inf in ['action']")


def test_a_recurrent_state_must_keep_its_shape_at_every_batch(load_policy):
    model = load_policy(policies.gru_cell())
    outputs = {"action": np.zeros((3, 2), np.float32), "h_next": np.zeros((3, 16), np.float32)}
    batches = {b: {"action": np.zeros((b, 2), np.float32), "h_next": np.zeros((b, 16), np.float32)} for b in (1, 2, 7)}
    name = "recurrent state h -> h_next"
    assert _checks(model, _arrays(outputs, batches=batches), outputs)[name][0] is True
    batches[2]["h_next"] = np.zeros((2, 8), np.float32)
    assert _checks(model, _arrays(outputs, batches=batches), outputs)[name] == (False, "batch2: shape [2, 8], declared ['batch', 16]")


def test_an_integer_action_with_continuous_bounds_says_they_are_not_read(load_policy):
    """int64 'action' with action_low/action_high and no action_n: the check said only 'without action_n', as if the
    model stated no bounds at all."""
    discrete = policies.cast_action_discrete()
    del discrete.metadata_props[:]
    helper.set_model_props(discrete, {"action_low": "0", "action_high": "2"})
    action = np.array([1, 2], np.int64)
    check = _checks(load_policy(discrete), _arrays({"action": action}), {"action": action})["action bounds"]
    assert check == (None, "discrete action without action_n in metadata (action_low/action_high bound a continuous "
                           "action, not read for it)")


@pytest.mark.parametrize("elem_type", [TensorProto.FLOAT8E5M2, TensorProto.BFLOAT16, TensorProto.INT4])
def test_an_element_type_numpy_has_no_own_dtype_for_is_refused_in_words(load_policy, elem_type):
    """float8_e5m2 (ml_dtypes says kind 'f') passed the check, and a run of ONNX's own test_cast_FLOAT_to_FLOAT8E5M2
    ended in a traceback reading the reference's .npz back ("descr is not a valid dtype descriptor: '<f1'")."""
    graph = helper.make_graph([helper.make_node("Cast", ["obs"], ["action"], to=elem_type)], "narrow",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("action", elem_type, ["batch", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    name = TensorProto.DataType.Name(elem_type)
    with pytest.raises(InputError, match=f"output 'action' has element type {name}: policy-matrix handles bool, integer "
                                         "and float16/32/64 tensors only"):
        load_policy(model)


@pytest.mark.parametrize("builder", [examples.continuous_mlp, policies.side_input_policy])
def test_the_action_output_is_the_one_named_action(builder, load_policy):
    assert contract.action_output(load_policy(builder())) == "action"


def test_a_policy_with_several_outputs_none_named_action_is_told_which_one_is_read_as_the_action(load_policy):
    """SB3's export guide leaves the outputs unnamed; with the value first, --env stepped Pendulum with the value
    (x100, clipped by the env) and the lint said only "no output named 'action'", not what the tool took instead."""
    model = load_policy(policies.ppo_guide_value_first())
    assert contract.action_output(model) == "17"
    assert _lints(model)["output-action"] == ("warn", (
        "no output named 'action' (outputs: ['17', 'onnx::Sub_12', '29']): the first, '17', is read as the action "
        "(its bounds, and what --env's episodes step with); where that is a value or a log-prob, name the action in "
        "the export: output_names=['action', ...]"))
    single = examples.continuous_mlp()
    single.graph.output[0].name = single.graph.node[-1].output[0] = "mean"
    assert _lints(load_policy(single))["output-action"] == ("warn", "no output named 'action' (outputs: ['mean'])")


def test_a_policy_whose_every_output_is_a_recurrent_state_is_told_what_is_read_as_the_action(load_policy):
    """(obs, h) -> h_next alone: the contract read h_next as the action and --env refused 'rollouts need an action
    output', while the lint said only "no output named 'action'", as of a policy whose one output is its action."""
    cell = policies.gru_cell()
    del cell.graph.output[0]
    assert _lints(load_policy(cell))["output-action"] == ("warn", (
        "no output named 'action' (outputs: ['h_next']), and each is taken for a recurrent state's next value: "
        "'h_next' is read as the action (its bounds), and --env has no action to step with; name the action in the "
        "export: output_names=['action', ...]"))


def test_a_recurrent_state_listed_first_is_never_read_as_the_action(load_policy):
    """The contract took the first output whatever it was; the episodes skipped the recurrent state's next value."""
    cell = policies.gru_cell()
    cell.graph.output[0].name = cell.graph.node[-1].output[0] = "mean"
    cell.graph.output.insert(0, cell.graph.output.pop(1))  # (h_next, mean), as an exporter may list them
    assert contract.action_output(load_policy(cell)) == "mean"


def test_a_dict_policy_s_observation_inputs_are_its_keys_not_a_missing_obs(tmp_path, load_policy):
    """SB3's MultiInputPolicy exports one input per Dict key: the lint named them as a missing 'obs'. Observation
    inputs are those that are neither a recurrent state nor fed whole; a single one not named 'obs' still warns."""
    import rollout_policies

    from matrix.inputs import model as model_loader

    seeker = _lints(model_loader.load(rollout_policies.goal_seeker(tmp_path / "goal_seeker.onnx")))
    assert seeker["input-obs"] == ("ok", "3 observation inputs ['observation', 'achieved_goal', 'desired_goal'] (besides "
                                         "recurrent state inputs ['h_in']): a Dict observation's keys, each fed by the "
                                         "key of its name under --env")
    assert _lints(load_policy(policies.side_input_policy()))["input-obs"] == ("ok", "one observation input named 'obs'")
    renamed = examples.continuous_mlp()
    renamed.graph.input[0].name = "state"
    for node in renamed.graph.node:
        node.input[:] = ["state" if name == "obs" else name for name in node.input]
    assert _lints(load_policy(renamed))["input-obs"] == ("warn", "expected one input named 'obs', found ['state']")


def test_a_model_given_in_fp16_keeps_decimal_metadata_bounds_as_float16_holds_them(load_policy):
    """A user's fp16 export of clamp(..., -0.3, 0.7) with action_low/high -0.3/0.7 in its metadata: its Clip holds 0.7
    as float16's 0.70020, and the float64 reference returns that. The lint called it the model leaving its bounds
    (only float32's rounding was allowed for); an fp32 model returning 0.70020 does leave them."""
    def with_metadata(proto):
        helper.set_model_props(proto, {"action_low": "-0.3", "action_high": "0.7"})
        return proto

    given_fp16 = load_policy(with_metadata(float16.convert_float_to_float16(policies.td3_actor(), keep_io_types=False)),
                             "fp16")
    assert given_fp16.outputs[0].dtype == "float16"
    saturated = {"action": np.array([[np.float16(-0.3)], [np.float16(0.7)]], np.float64)}  # its float64 reference
    found = reference_bounds(given_fp16, saturated)
    assert (found.level, found.message) == ("ok", "the float64 reference keeps the action in [-0.3, 0.7] (metadata)")
    beyond = {"action": np.array([[0.7007]], np.float64)}  # further out than float16's rounding of the bound
    assert reference_bounds(given_fp16, beyond).level == "warn"
    given_fp32 = load_policy(with_metadata(policies.td3_actor()), "fp32")
    assert reference_bounds(given_fp32, saturated).level == "warn"
