"""paddle-custom-gcu's fast custom ops as the engine calls them (Enflame GCU): their expected and
registered signatures (signatures.py) and thin call wrappers (custom_ops.py). Which of them an
engine uses is the platform layer's decision (kernels gcu_attention, gcu_rotary, gcu_rms_norm,
fused_moe), made at start from the registry, the signatures and a numerical check."""
