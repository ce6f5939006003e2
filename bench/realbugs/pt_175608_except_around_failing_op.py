"""An op that raises inside try/except RuntimeError: eager takes the except branch, dynamo turns the error into its own.

issue:    https://github.com/pytorch/pytorch/issues/175608
checks:   compiled `try: linalg.inv(x) except RuntimeError: return x + 1` on a 2x3 x returns x + 1 as eager does
fails on: 2.13.0+cpu (checked here: TorchRuntimeError from fake-tensor propagation); the issue: 2.10, CPU
kind:     compile error
feature:  dynamo exception handling (an op's error during fake-tensor tracing is not catchable by user code)
"""

import torch


def invert_or_shift(x: torch.Tensor) -> torch.Tensor:
    try:
        with torch.no_grad():
            torch.linalg.inv(x)
    except RuntimeError:
        return x + 1
    return x


def test_pt_175608_except_around_failing_op() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    expected = invert_or_shift(x)
    actual = torch.compile(invert_or_shift)(x)
    torch.testing.assert_close(actual, expected)


if __name__ == "__main__":
    test_pt_175608_except_around_failing_op()
