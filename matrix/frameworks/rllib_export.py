"""RLlib (ray[rllib]): declared, not built yet. It installs here (ray 2.60.0 over the Core ML
environment's torch: ~700 MB, ~3 min), but its new API stack (RLModule) documents no ONNX export
(`Algorithm.export_policy_model(onnx=...)` belongs to the old stack), so this row says so instead of
guessing a path.

The declarations at the top are read by policy-matrix.
"""

PACKAGE = "ray"
VERSION = "2.60.0"
REQUIREMENTS = ["ray[rllib]=={version}", "onnxscript==0.7.2"]
BASE = "torch"
POLICIES: dict[str, str] = {}
EXPORT = "none documented for the new API stack's RLModule"
UNAVAILABLE = ("not built: RLlib 2.60 installs here (~700 MB, ~3 min) but its default (new) API stack documents no "
               "ONNX export; Algorithm.export_policy_model(onnx=...) is the old stack's")
