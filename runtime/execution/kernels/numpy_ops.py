"""The numpy backend: importing this module registers every numpy kernel, family by family."""

from runtime.execution.kernels import (numpy_control, numpy_conv, numpy_dist, numpy_elementwise,
                                       numpy_math, numpy_nn, numpy_optim, numpy_tensor,
                                       numpy_text)

__all__ = ["numpy_control", "numpy_conv", "numpy_dist", "numpy_elementwise", "numpy_math",
           "numpy_nn", "numpy_optim", "numpy_tensor", "numpy_text"]
