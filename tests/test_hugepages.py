"""CPU model weights move to one huge-page arena: values, dtypes and shapes are kept, a tensor
shared by two slots (tied embeddings) stays shared, and the model still reads them."""
import torch

from llmkern.models.hugepages import move_to_hugepages


def test_copies_keep_values_and_sharing():
    a = torch.randn(300, 7)
    b = torch.randn(5).to(torch.bfloat16)
    c = torch.arange(10, dtype=torch.int32)
    out = move_to_hugepages([a, b, a, None, c])
    assert out[3] is None
    for src, dst in zip([a, b, a, c], [out[0], out[1], out[2], out[4]]):
        assert dst.dtype == src.dtype and dst.shape == src.shape and torch.equal(dst, src)
        assert dst.data_ptr() != src.data_ptr()  # a copy
        assert dst.data_ptr() % 64 == 0
    assert out[0].data_ptr() == out[2].data_ptr()  # tied stays tied
    out[0].add_(1)  # writable, independent of the source
    assert torch.equal(out[2], a + 1) and not torch.equal(out[0], a)
