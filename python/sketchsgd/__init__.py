"""sketchsgd: gradient compression for distributed SGD (count sketches, top-k, TernGrad,
signSGD), from C++/CUDA.

    import sketchsgd
    c = sketchsgd.Compressor("sketch:rows=1,cols=100000,k=20000", dim=model_size)
    print(sketchsgd.describe())          # every codec and option

For DDP, see sketchsgd.torch (CompressionState, compression_hook).
"""

import torch as _torch

from . import _version

_version.check(_torch.__version__)

from . import _core  # noqa: E402
from ._core import (  # noqa: E402
    ConfigMismatch,
    CudaError,
    Error,
    InvalidArgument,
    JobFinished,
    NonFiniteError,
    ProtocolError,
    TimeoutError,
    WireError,
    codecs,
    describe,
    example_specs,
    gpu_count,
    message_info,
    sample_clients,
)
from ._compressor import Aggregator, Compressor, gathered  # noqa: E402

cuda_build = _core.cuda_build

__all__ = [
    "Aggregator", "Compressor", "ConfigMismatch", "CudaError", "Error", "InvalidArgument",
    "JobFinished", "NonFiniteError", "ProtocolError", "TimeoutError", "WireError", "codecs",
    "cuda_build", "describe", "example_specs", "gathered", "gpu_count", "message_info", "sample_clients",
]
