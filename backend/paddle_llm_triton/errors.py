"""Engine error codes -> Triton error codes, in one place (responder, ensemble pipeline)."""

from __future__ import annotations


def triton_code(error_code: str | None):
    """RequestOutput.error_code ("invalid_arg", "unavailable", anything else) -> the
    pb_utils.TritonError code (INVALID_ARG, UNAVAILABLE, INTERNAL)."""
    import triton_python_backend_utils as pb_utils

    E = pb_utils.TritonError
    return {"invalid_arg": E.INVALID_ARG, "unavailable": E.UNAVAILABLE}.get(error_code, E.INTERNAL)
