"""The readiness gate: a tiny Python model the launcher serves from a repository of its own, beside
the user's, so that it can turn /v2/health/ready false at once when it starts draining.

Triton 2.51 gives a Python model no way to report itself not ready, and its server readiness (strict
readiness) is "every model of the repositories is ready". Unloading any model turns it false; the
gate is the model whose unloading costs nothing: the real models stay loaded and keep serving the
requests in flight, and answer new ones with UNAVAILABLE while they drain. Its execute() refuses
every request (it is not an inference model). It lives outside model_repository/, so a plain
`tritonserver --model-repository model_repository` never sees it.
"""

from __future__ import annotations

from pathlib import Path

GATE_MODEL = "readiness_gate"

_CONFIG = f'''# The launcher's readiness gate (paddle_llm_triton/launcher/gate.py): not an inference model.
name: "{GATE_MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "unused" data_type: TYPE_BOOL dims: [ 1 ] optional: true }} ]
output [ {{ name: "unused_out" data_type: TYPE_BOOL dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''

_MODEL = '''"""The launcher's readiness gate: unloaded when the server starts draining. Not an inference model."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
            "readiness_gate is the launcher's readiness switch, not an inference model",
            pb_utils.TritonError.UNSUPPORTED)) for _ in requests]
'''


def make_gate_repository(root: str | Path) -> Path:
    """Write the gate's model repository under `root` (created); returns the repository folder."""
    repo = Path(root) / "gate_repository"
    (repo / GATE_MODEL / "1").mkdir(parents=True, exist_ok=True)
    (repo / GATE_MODEL / "config.pbtxt").write_text(_CONFIG)
    (repo / GATE_MODEL / "1" / "model.py").write_text(_MODEL)
    return repo
