"""ONNX's own backend node tests, every one, through `policy-matrix run` as a user would run it.

Each case is a model with fixed inputs and the outputs ONNX expects; it runs with `--obs` its inputs on the
targets given, and the sweep sorts what happened: the tool crashing (a traceback, an exit code other than 0, 1 or
2, a run past the timeout), a float64 reference that differs from ONNX's expected outputs, the one-line refusals
(exit 2) grouped by their words, and the cells that did not PASS grouped by their reason, so a reader can tell a
runtime's failure from the tool's. tests/test_backend_node_cases.py keeps the cases that once broke the tool;
this finds the next ones (2026-12-03: ConstantOfShape's float32 default, a rank-0 output, float8_e5m2, the
deprecated Scatter).

The test data ships inside older onnx wheels: the onnx2tf environment `make setup` builds has it. Its expected
outputs are that onnx's (1.19.1), so an operator whose definition changed since (Attention's qk_matmul_output)
differs from this onnx's reference without either being wrong.

    .venv/bin/python bench/node_sweep.py [--targets ort-cpu] [--variants fp32] [--every 1] [--jsonl FILE] [CASE ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from targets.paths import cache_dir

GOOD_EXITS = (0, 1, 2)


def node_test_data() -> Path:
    found = sorted(cache_dir().glob("envs/*/lib/python*/site-packages/onnx/backend/test/data/node"))
    if not found:
        sys.exit("ONNX backend node test data not found: `make setup` builds the onnx2tf environment that has it")
    return found[0]


def tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda path: int(path.stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(path))) for path in files]


def run_case(case: Path, targets: str, variants: str, timeout_s: float) -> dict:
    record: dict = {"case": case.name}
    graph = onnx.load(str(case / "model.onnx")).graph
    initialized = {tensor.name for tensor in graph.initializer}
    try:
        feeds = dict(zip([v.name for v in graph.input if v.name not in initialized], tensors(case / "test_data_set_0", "input")))
        expected = dict(zip([v.name for v in graph.output], tensors(case / "test_data_set_0", "output")))
    except Exception as error:  # sequences, optionals: no .npz can hold them
        return {**record, "unfed": f"{type(error).__name__}: {error}"[:200]}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        np.savez(folder / "inputs.npz", **feeds)
        command = [sys.executable, "-m", "matrix", "-q", "run", str(case / "model.onnx"), "--obs", str(folder / "inputs.npz"),
                   "--targets", targets, "--variants", variants, "--iters", "3", "--warmup", "1",
                   "--out", str(folder / "out"), "--fail-on", "never"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {**record, "exit": "timeout"}
        stderr = done.stderr.replace(str(case), case.name).strip()  # the data's long path would crowd out the words
        record |= {"exit": done.returncode, "stderr": stderr[-600:], "traceback": "Traceback" in stderr}
        record["reference_differs"] = differing_outputs(folder / "out" / "reference.npz", expected)
        results = folder / "out" / "results.json"
        if results.exists():
            record["cells"] = [(c["target"], c["variant"], c["verdict"], (c.get("reasons") or [""])[0][:120])
                               for c in json.loads(results.read_text())["cells"]]
    return record


def differing_outputs(path: Path, expected: dict[str, np.ndarray]) -> list[str]:
    if not path.exists():
        return []
    with np.load(path) as reference:
        return [name for name, value in expected.items()
                if name not in reference.files or reference[name].shape != value.shape
                or not np.allclose(reference[name], value.astype(np.float64), rtol=1e-3, atol=1e-4, equal_nan=True)]


def summary(records: list[dict]) -> None:
    crashed = [r for r in records if r.get("traceback") or r.get("exit") not in (*GOOD_EXITS, None)]
    print(f"{len(records)} cases: {sum(r.get('exit') == 0 for r in records)} ran, "
          f"{sum(r.get('exit') == 2 for r in records)} refused (exit 2), {sum('unfed' in r for r in records)} not feedable "
          f"from an .npz, {len(crashed)} crashed")
    for record in crashed:
        print(f"  CRASH {record['case']}: exit {record['exit']}: {record.get('stderr', '')[-300:]}")
    for record in records:
        if record.get("reference_differs"):
            print(f"  reference differs from ONNX's expected outputs: {record['case']}: {', '.join(record['reference_differs'])}")
    grouped(["exit 2: " + re.sub(r"'[^']*'", "'…'", r["stderr"])[:140] for r in records if r.get("exit") == 2],
            [r["case"] for r in records if r.get("exit") == 2])
    cells = [(f"{verdict} {target} {variant}: {reason[:100]}", r["case"])
             for r in records for target, variant, verdict, reason in r.get("cells", []) if verdict != "PASS"]
    grouped([words for words, _ in cells], [case for _, case in cells])


def grouped(words: list[str], cases: list[str]) -> None:
    by_words: dict[str, list[str]] = collections.defaultdict(list)
    for line, case in zip(words, cases):
        by_words[line].append(case)
    for line, named in sorted(by_words.items(), key=lambda item: -len(item[1])):
        print(f"  {len(named):4d} {line} (e.g. {', '.join(named[:3])})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="case folder names (default: every case)")
    parser.add_argument("--targets", default="ort-cpu")
    parser.add_argument("--variants", default="fp32")
    parser.add_argument("--every", type=int, default=1, help="run every Nth case only")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case before it counts as a hang")
    parser.add_argument("--jsonl", type=Path, help="also write one JSON line per case here")
    args = parser.parse_args()
    data = node_test_data()
    names = args.cases or sorted(path.name for path in data.iterdir() if path.is_dir())
    records = []
    for index, name in enumerate(names[::args.every], 1):
        records.append(run_case(data / name, args.targets, args.variants, args.timeout))
        print(f"\r{index}/{len(names[::args.every])} {name[:60]:60s}", end="", file=sys.stderr, flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as file:
                file.write(json.dumps(records[-1]) + "\n")
    print(file=sys.stderr)
    summary(records)


if __name__ == "__main__":
    main()
