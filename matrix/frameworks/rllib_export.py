"""RLlib (ray[rllib]): declared, not built yet. ray 2.60.0 installed here over the Core ML
environment's torch in ~3 min (~700 MB). RLlib's ONNX export, `Algorithm.export_policy_model(dir,
onnx=OPSET)`, goes through `get_policy(...).export_model`, the old API stack's Policy; the default
new stack (RLModule + Learner) has no Policy to export, so its documented path would mean enabling the
old stack. Until a build is written for one of the two, the table shows this row instead of a guess.

The declarations at the top are read by policy-matrix.
"""

PACKAGE = "ray"
VERSION = "2.60.0"
REQUIREMENTS = ["ray[rllib]=={version}", "onnxscript==0.7.2"]
BASE = "torch"
POLICIES: dict[str, str] = {}
EXPORT = "Algorithm.export_policy_model(onnx=OPSET): the old API stack's Policy.export_model"
UNAVAILABLE = ("not built yet: ray[rllib] 2.60.0 installs here (~3 min, ~700 MB), but its ONNX export "
               "(Algorithm.export_policy_model -> Policy.export_model) needs the old API stack, and no build "
               "for either stack is written")
