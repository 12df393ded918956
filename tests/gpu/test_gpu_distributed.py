"""Context parallelism over NCCL on 2 (and 4) GPUs of one host: the Gloo suites of
``tests/test_distributed.py`` again with CUDA tensors, and a suite at lengths where the Hopper
kernels take the ring's block calls (``GPU_2`` in ``tests/distributed_worker.py``). Each suite
starts one process a GPU; skipped with fewer GPUs."""
import pytest
import torch
from distributed_worker import launch
from test_distributed import assert_error_bounded, assert_ok, assert_raised_alike

pytestmark = pytest.mark.gpu
TIMEOUT_S = 600


def _needs(gpus):
    return pytest.mark.skipif(torch.cuda.device_count() < gpus, reason=f"needs {gpus} CUDA devices")


@_needs(2)
def test_two_gpus_small(tmp_path):
    results = launch("ring2", 2, tmp_path, cuda=True, timeout=TIMEOUT_S)
    assert_ok(results)
    assert_error_bounded(results, 2)


@_needs(2)
def test_two_gpus(tmp_path):
    assert_ok(launch("gpu2", 2, tmp_path, cuda=True, timeout=TIMEOUT_S))


@_needs(4)
def test_four_gpus(tmp_path):
    results = launch("ring4", 4, tmp_path, cuda=True, timeout=TIMEOUT_S)
    assert_ok(results)
    assert_error_bounded(results, 4)


@_needs(2)
def test_bad_input_raises_on_every_gpu_rank(tmp_path):
    assert_raised_alike(launch("errors2", 2, tmp_path, cuda=True, timeout=TIMEOUT_S))
