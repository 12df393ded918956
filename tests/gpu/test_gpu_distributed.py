"""Context parallelism over NCCL on 2 (and 4) GPUs of one host: the Gloo suites of
``tests/test_distributed.py`` again with CUDA tensors, and a suite at lengths where the Hopper
kernels take the ring's block calls (``GPU_2`` in ``tests/distributed_worker.py``). Each suite
starts one process a GPU; skipped with fewer GPUs."""
import pytest
import torch

from distributed_worker import ERRORS_2, GPU_2, RING_2, RING_4, launch
from test_distributed import assert_ok, assert_raised_alike

pytestmark = pytest.mark.gpu


def _needs(gpus):
    return pytest.mark.skipif(torch.cuda.device_count() < gpus, reason=f"needs {gpus} CUDA devices")


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    done = {}

    def get(suite, world):
        if suite not in done:
            done[suite] = launch(suite, world, tmp_path_factory.mktemp(suite), cuda=True, timeout=600)
        return done[suite]
    return get


@_needs(2)
@pytest.mark.parametrize("case", list(RING_2))
def test_two_gpus_small(suites, case):
    assert_ok(suites("ring2", 2), case)


@_needs(2)
@pytest.mark.parametrize("case", list(GPU_2))
def test_two_gpus(suites, case):
    assert_ok(suites("gpu2", 2), case)


@_needs(4)
@pytest.mark.parametrize("case", list(RING_4))
def test_four_gpus(suites, case):
    assert_ok(suites("ring4", 4), case)


@_needs(2)
@pytest.mark.parametrize("case", list(ERRORS_2))
def test_bad_input_raises_on_every_gpu_rank(suites, case):
    assert_raised_alike(suites("errors2", 2), case)
