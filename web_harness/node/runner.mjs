// The ort-node target's runner: one process per session, driven by Python
// (targets/ort_node.py) with one JSON request per stdin line and one JSON reply
// per stdout line. ORT's own log goes to stderr, which Python keeps in a file
// to read placement from. Latency is taken here with process.hrtime.

import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { decodeFeeds, encodeOutputs, tensorRunner } from '../page/tensors.mjs';

// The harness's onnxruntime-node, or a pinned release's own node_modules (ort-node@1.22.0:
// targets/versions.py hands its folder over in POLICY_MATRIX_NODE_MODULES). A bare ES import cannot
// be pointed elsewhere, so the package (CommonJS) is required from where it lies.
const pinned = process.env.POLICY_MATRIX_NODE_MODULES;
const ort = createRequire(pinned ? `${pinned}/` : import.meta.url)('onnxruntime-node');

let session = null;
const QUIET = { logSeverityLevel: 3 };  // keep per-run logging out of the timed calls

async function open({ model, threads, backend }) {
  const started = process.hrtime.bigint();
  session = await ort.InferenceSession.create(model, {
    executionProviders: [backend],
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
    logSeverityLevel: 0,
    logVerbosityLevel: 0,
  });
  return {
    createMs: Number(process.hrtime.bigint() - started) / 1e6,
    inputNames: session.inputNames,
    outputNames: session.outputNames,
    versions: { ...ort.env.versions, nodejs: process.versions.node },
  };
}

async function run({ feeds }) {
  return encodeOutputs(await tensorRunner(session, QUIET)(decodeFeeds(ort, feeds)));
}

async function time({ feeds, warmup, iters }) {
  const inputs = decodeFeeds(ort, feeds);
  const call = tensorRunner(session, QUIET);
  for (let i = 0; i < warmup; i++) await call(inputs);
  const samples = new Array(iters);
  for (let i = 0; i < iters; i++) {
    const start = process.hrtime.bigint();
    await call(inputs);
    samples[i] = Number(process.hrtime.bigint() - start);
  }
  return samples;
}

const handlers = { open, run, time };

for await (const line of createInterface({ input: process.stdin })) {
  const request = JSON.parse(line);
  let reply;
  try {
    reply = { ok: true, result: await handlers[request.op](request) };
  } catch (error) {
    reply = { ok: false, error: String(error && error.message ? error.message : error) };
  }
  process.stdout.write(JSON.stringify(reply) + '\n');
}
