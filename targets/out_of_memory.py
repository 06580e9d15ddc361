"""The words runtimes, converters and the libraries under them use when an allocation fails. One list for the
tool's guarded steps (matrix.run.guarded names a capped step's failure as the cap) and the converters' caches
(targets.build_once: running out of memory is not the converter's refusal of the model, so it is not cached).
It lives in targets because targets never import matrix."""

MEMORY_WORDS = ("MemoryError", "bad_alloc", "Unable to allocate", "Failed to allocate", "Cannot allocate memory",
                "can't allocate memory",  # torch's CPU allocator
                "out of memory", "std::length_error", "Memory allocation still failed",  # OpenBLAS
                "failed to map segment from shared object",  # the loader, when the cap refuses a library's mapping
                "cannot allocate memory for thread-local data",  # glibc, when it refuses a new thread's
                # protobuf's upb encoder, when its arena cannot grow (its other causes, a missing required field or
                # nesting past 100, do not occur in an ONNX model that loaded): onnx.save under the cap says only this
                "EncodeError: Failed to serialize proto")


def looks_out_of_memory(text: str) -> bool:
    return any(word in text for word in MEMORY_WORDS)
