"""bwstack test fixture shaped like sgl_kernel: importing it picks and loads common_ops for the GPU."""

from sgl_kernel.load_utils import _load_architecture_specific_ops

common_ops = _load_architecture_specific_ops()
