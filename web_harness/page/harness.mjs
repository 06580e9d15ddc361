// Runs inside headless Chromium. Python (targets/ort_web.py) drives it through
// window.harness: one ORT bundle per page, sessions keyed by a name, tensors in
// and out as base64 bytes, latency taken here with performance.now().
// No top-level await here: targets/chromium.py takes a document that completed loading without window.harness
// for a harness that failed to load (index.html keeps why), so window.harness must be set as this module runs.

import { bytesFromBase64, decodeFeeds, encodeOutputs, tensorRunner } from './tensors.mjs';

// ORT prints its placement decisions as log lines; keep every console line
// (installed before ORT is imported, so ORT's own logger goes through it).
// The lines are kept here only, not passed on to the browser's console: each console
// call is serialized over the DevTools pipe to the browser and Playwright's driver,
// which was most of a small session's creation with the verbose log on.
const logLines = [];
for (const level of ['log', 'info', 'warn', 'error', 'debug']) {
  console[level] = (...args) => {
    logLines.push(args.map(String).join(' '));
  };
}

let ort = null;
const sessions = new Map();
const QUIET = { logSeverityLevel: 3 };  // keep per-run logging out of the timed calls

async function webgpuAdapter() {
  if (!navigator.gpu) return { present: false, reason: 'navigator.gpu is missing (WebGPU disabled in this browser)' };
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return { present: false, reason: 'navigator.gpu.requestAdapter() returned null (no WebGPU adapter)' };
  const info = adapter.info || {};
  return {
    present: true,
    vendor: info.vendor || '', architecture: info.architecture || '',
    description: info.description || '', device: info.device || '',
    isFallbackAdapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
    shaderF16: adapter.features.has('shader-f16'),
  };
}

function webglRenderer() {
  const gl = document.createElement('canvas').getContext('webgl2');
  if (!gl) return { present: false, reason: 'no WebGL2 context in this browser' };
  const debug = gl.getExtension('WEBGL_debug_renderer_info');
  return {
    present: true,
    vendor: debug ? gl.getParameter(debug.UNMASKED_VENDOR_WEBGL) : gl.getParameter(gl.VENDOR),
    renderer: debug ? gl.getParameter(debug.UNMASKED_RENDERER_WEBGL) : gl.getParameter(gl.RENDERER),
  };
}

// The smallest step performance.now() takes in this page, in microseconds: browsers coarsen
// the clock (5 us cross-origin isolated in Chromium, 100 us without), so a p50 near it is rounding.
function timerStepUs(samples = 50) {
  let step = Infinity;
  for (let i = 0; i < samples; i++) {
    const first = performance.now();
    let next = performance.now();
    while (next === first) next = performance.now();
    step = Math.min(step, next - first);
  }
  return Math.round(step * 1e6) / 1e3;  // ms -> us, to the nanosecond
}

async function load(bundleUrl, wasmPaths) {
  ort = await import(bundleUrl);
  ort.env.wasm.wasmPaths = wasmPaths;
  ort.env.wasm.proxy = false;
  return { version: ort.env.versions, crossOriginIsolated: self.crossOriginIsolated, timerStepUs: timerStepUs() };
}

async function probe(backend) {
  if (backend === 'webgpu') return webgpuAdapter();
  if (backend === 'webgl') return webglRenderer();
  return { present: true };
}

// The runtime's own start, before any cell's cold start is timed (as an in-process runtime's import is):
// a throwaway session of a one-node model makes ORT compile and instantiate its wasm module with the
// cells' thread count and start the backend (WebGL context, WebGPU device). It runs nothing. A failure
// is left for the cell's own session to meet and report in its own words.
async function startRuntime(backend, threads, modelB64) {
  ort.env.wasm.numThreads = threads;
  try {
    const session = await ort.InferenceSession.create(bytesFromBase64(modelB64), { executionProviders: [backend], ...QUIET });
    await session.release();
    return { started: true };
  } catch (error) {
    return { started: false, error: String(error && error.message ? error.message : error) };
  }
}

async function open(key, modelUrl, backend, threads, verbose) {
  ort.env.wasm.numThreads = threads;
  const firstLine = logLines.length;
  const options = {
    executionProviders: [backend],
    graphOptimizationLevel: 'all',
    logSeverityLevel: verbose ? 0 : 2,
    logVerbosityLevel: 0,
  };
  const started = performance.now();
  const session = await ort.InferenceSession.create(modelUrl, options);
  const createMs = performance.now() - started;
  sessions.set(key, session);
  return {
    createMs,
    inputNames: session.inputNames,
    outputNames: session.outputNames,
    log: logLines.slice(firstLine),
  };
}

async function run(key, wire) {
  const results = await tensorRunner(sessions.get(key), QUIET)(decodeFeeds(ort, wire));
  return encodeOutputs(results);
}

// Per-call latency in integer nanoseconds; the await includes reading outputs
// back to the CPU, as a caller of session.run() would see it.
async function time(key, wire, warmup, iters) {
  const call = tensorRunner(sessions.get(key), QUIET);
  const feeds = decodeFeeds(ort, wire);
  for (let i = 0; i < warmup; i++) await call(feeds);
  const samples = new Array(iters);
  for (let i = 0; i < iters; i++) {
    const start = performance.now();
    await call(feeds);
    samples[i] = Math.round((performance.now() - start) * 1e6);
  }
  return samples;
}

// The bench's baseline: one bare loop of session.run, timed once around the loop.
async function bareLoop(key, wire, iters) {
  const session = sessions.get(key);
  const feeds = decodeFeeds(ort, wire);
  const start = performance.now();
  for (let i = 0; i < iters; i++) await session.run(feeds, QUIET);
  return ((performance.now() - start) / iters) * 1e6;
}

async function release(key) {
  const session = sessions.get(key);
  sessions.delete(key);
  if (session) await session.release();
}

// Errors come back as ORT's message (no stack), the words a cell reports.
function reporting(fn) {
  return async (...args) => {
    try {
      return { ok: true, result: await fn(...args) };
    } catch (error) {
      return { ok: false, error: String(error && error.message ? error.message : error) };
    }
  };
}

window.harness = Object.fromEntries(
  Object.entries({ load, probe, startRuntime, open, run, time, bareLoop, release }).map(([name, fn]) => [name, reporting(fn)]),
);
