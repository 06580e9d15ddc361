// Tensors cross the Python boundary as {dtype, shape, b64}: raw little-endian
// bytes in base64. Shared by the page and the node runner (which has Buffer).

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int32: Int32Array, int64: BigInt64Array,
  uint8: Uint8Array, int8: Int8Array, uint16: Uint16Array, int16: Int16Array,
  uint32: Uint32Array, uint64: BigUint64Array, bool: Uint8Array,
  // float16 travels as raw 16-bit words; ORT accepts a Uint16Array for it.
  float16: Uint16Array,
};

export function bytesFromBase64(b64) {
  if (typeof Buffer !== 'undefined') return new Uint8Array(Buffer.from(b64, 'base64'));
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);
  const text = atob(b64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

function base64FromBytes(bytes) {
  if (typeof Buffer !== 'undefined') return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
  if (bytes.toBase64) return bytes.toBase64();
  let text = '';
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  }
  return btoa(text);
}

export function decodeFeeds(ort, wire) {
  const feeds = {};
  for (const [name, t] of Object.entries(wire)) {
    const Array = ARRAYS[t.dtype];
    if (!Array) throw new Error(`unsupported input dtype ${t.dtype} for ${name}`);
    const bytes = bytesFromBase64(t.b64);
    // Copy into an aligned buffer: typed arrays need offsets that are multiples of their size.
    const data = new Array(bytes.slice().buffer);
    feeds[name] = new ort.Tensor(t.dtype === 'bool' ? 'bool' : t.dtype, data, t.shape);
  }
  return feeds;
}

// A sequence or map output (skl2onnx's ZipMap) is left out of the matrix, and onnxruntime-web cannot
// read one back: a session that has one fetches its tensor outputs only.
export function tensorRunner(session, options) {
  const meta = outputMetadata(session);
  if (!meta || meta.every((m) => m.isTensor !== false)) return (feeds) => session.run(feeds, options);
  const fetches = session.outputNames.filter((_, i) => meta[i].isTensor !== false);
  return (feeds) => session.run(feeds, fetches, options);
}

// The WebGL backend throws "Getting model metadata is not supported in webgl backend": no metadata
// means no ZipMap can be told apart there, so every output is fetched (as before the metadata existed).
function outputMetadata(session) {
  try {
    return session.outputMetadata;
  } catch {
    return undefined;
  }
}

export function encodeOutputs(results) {
  const wire = {};
  for (const [name, tensor] of Object.entries(results)) {
    if (!tensor?.dims) continue; // a sequence or map output (a ZipMap) is left out of the matrix
    const data = tensor.data;
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    wire[name] = { dtype: tensor.type, shape: Array.from(tensor.dims), b64: base64FromBytes(bytes) };
  }
  return wire;
}
