"""The vision tower's attention kernel order (`engine/vision_attention.py`): measured on a GPU at start;
on a CPU nothing is measured and nothing changes. What a person would notice if it broke: attention
elsewhere in the process left on the tower's kernels after a screenshot (the flags are process-wide),
or a screenshot's features that change with the kernel order."""

import torch
from torch.nn.attention import SDPBackend

from qvl_agent.engine.vision_attention import VisionAttention, measure


def _flags() -> tuple[bool, ...]:
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())


def test_a_cpu_measures_nothing_and_keeps_pytorchs_order():
    found = measure(16, 64, torch.float32, torch.device("cpu"))
    assert found.order == [] and found.ms == {}
    before = _flags()
    with found.scope():
        assert _flags() == before
    assert "not measured" in found.describe()


def test_the_measured_order_holds_only_inside_its_scope_and_changes_no_number():
    chosen = VisionAttention(order=[SDPBackend.EFFICIENT_ATTENTION], ms={"efficient_attention": 1.0})
    q, k, v = (torch.randn(1, 2, 64, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    before = _flags()
    with chosen.scope():
        assert _flags() == (False, True, True, False)  # the measured kernels, then math for any other shape
        inside = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert _flags() == before
    torch.testing.assert_close(inside, plain, rtol=1e-5, atol=1e-5)
    assert chosen.describe().startswith("vision attention at 32768 tokens: efficient_attention 1.0 ms")
