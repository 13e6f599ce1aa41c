"""Exception classes raised by the kernels (csrc/common/errors.h maps C++ errors onto them)."""


class IndexOutOfRangeError(ValueError, RuntimeError):
    """An index or length past what a table holds (a block_table entry, a cache's capacity).

    A ValueError, as every llmkern argument error, and also a RuntimeError, which is what
    flash-attn raises for the same inputs, so callers written for either keep working."""
