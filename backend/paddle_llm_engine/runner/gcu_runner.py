"""GCU runner: device "gcu:<id>" through the paddle-custom-gcu plug-in.

Not run on Enflame hardware yet (no GCU host reachable); CI runs it on a test stand-in plug-in that
registers a "gcu" device backed by host memory (tests/gcu_standin). The platform layer decides the
dtype (bfloat16 where the plug-in registers bf16 kernels for every op of the model), the fused
kernels the plug-in offers, and Paddle flags such as FLAGS_use_stride_kernel. With
kv_cache_memory_fraction set, the KV cache is sized from the device memory the plug-in reports
after the weights are loaded (total memory minus paddle.device.memory_reserved); when it reports
none, from kv_cache_memory_bytes with a warning. num_kv_blocks, when set, wins over both.
"""

from __future__ import annotations

import paddle

from paddle_llm_engine.platforms import check_gcu_versions, gcu_available_memory
from paddle_llm_engine.runner.base import ModelRunnerBase


class GCUModelRunner(ModelRunnerBase):
    """ModelRunnerBase on "gcu:<id>". Raises PlatformError at start for a plug-in whose version does
    not match the installed paddlepaddle."""

    def setup_device(self) -> None:
        check_gcu_versions()
        paddle.set_device(self.device)  # "gcu:<id>", registered by the plug-in

    def available_memory_bytes(self) -> int | None:
        return gcu_available_memory(self.device)
