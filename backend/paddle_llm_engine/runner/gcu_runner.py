"""GCU runner: device "gcu:<id>" through the paddle-custom-gcu plug-in.

Not run on hardware yet (no GCU host reachable). With kv_cache_memory_fraction set, the KV cache is
sized from the device memory Paddle reports after the weights are loaded (total memory from
paddle.device.get_device_properties minus paddle.device.memory_reserved); when the plug-in does not
report it, from kv_cache_memory_bytes with a warning. num_kv_blocks, when set, wins over both.
"""

from __future__ import annotations

import paddle

from paddle_llm_engine.platforms import check_gcu_versions, gcu_available_memory
from paddle_llm_engine.runner.base import ModelRunnerBase


class GCUModelRunner(ModelRunnerBase):
    def setup_device(self) -> None:
        check_gcu_versions()
        paddle.set_device(self.device)  # "gcu:<id>", registered by the plug-in

    def available_memory_bytes(self) -> int | None:
        return gcu_available_memory(self.device)
