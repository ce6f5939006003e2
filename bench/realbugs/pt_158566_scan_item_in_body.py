"""torch.ops.higher_order.scan whose body indexes with `.item()` of its scanned value: every backend refuses it.

issue:    https://github.com/pytorch/pytorch/issues/158566
checks:   compiled scan copying x[i] into y[i] for i over arange(n) runs as eager does
fails on: 2.13.0+cpu (checked here); the issue: 2.8 (UncapturedHigherOrderOpError, all backends)
kind:     compile error
feature:  higher-order ops (scan), data-dependent scalars inside a subgraph, no graph holds the bug
"""

import torch


class CopyByScan(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        def body(y, iv):
            y[iv.item()] = x[iv.item()]
            return [y, iv]

        return torch.ops.higher_order.scan(body, [torch.zeros(x.size(0))], [torch.arange(x.size(0))], [])


def test_pt_158566_scan_item_in_body() -> None:
    x = torch.randn(5)
    expected = CopyByScan()(x)
    actual = torch.compile(CopyByScan(), backend="eager")(x)
    assert torch.equal(actual[0], expected[0])


if __name__ == "__main__":
    test_pt_158566_scan_item_in_body()
