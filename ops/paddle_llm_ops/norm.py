"""RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * weight."""

import paddle


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x: [..., H] fp32, weight: [H]; returns [..., H]. Variance in fp32 as HF Llama does."""
    var = x.pow(2).mean(axis=-1, keepdim=True)
    return x * paddle.rsqrt(var + eps) * weight
