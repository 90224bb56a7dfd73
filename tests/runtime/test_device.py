"""Which CUDA device a launched process makes current; decided without needing a GPU."""

import pytest
import torch

from pimm_fn.runtime.step.devices import local_cuda_index, misplaced_model, use_local_cuda_device


def test_local_rank_names_the_device_in_a_process_group():
    """torchrun's LOCAL_RANK 3 on a node with 4 GPUs: device 3."""
    assert local_cuda_index({"LOCAL_RANK": "3"}, device_count=4, grouped=True) == 3


def test_nothing_is_chosen_without_cuda():
    """No CUDA device: CUDA is left alone whatever the environment says."""
    assert local_cuda_index({"LOCAL_RANK": "1"}, device_count=0, grouped=True) is None
    assert local_cuda_index({"LOCAL_RANK": "0"}, device_count=0, grouped=True, model_device=torch.device("cpu")) is None


def test_nothing_is_chosen_outside_a_process_group_or_a_launch():
    """A plain script (no group) or a group without LOCAL_RANK keeps the current device."""
    assert local_cuda_index({"LOCAL_RANK": "1"}, device_count=4, grouped=False) is None
    assert local_cuda_index({}, device_count=4, grouped=True) is None


def test_a_model_already_on_a_gpu_keeps_its_device():
    """The user put the model on cuda:2: that device is made current, as DDP will use it."""
    assert (
        local_cuda_index({"LOCAL_RANK": "2"}, device_count=4, grouped=True, model_device=torch.device("cuda", 2)) == 2
    )
    assert local_cuda_index({}, device_count=4, grouped=False, model_device=torch.device("cuda", 1)) == 1


def test_a_model_on_the_cpu_follows_local_rank():
    """Parameters on the CPU say nothing about the GPU: LOCAL_RANK decides."""
    assert local_cuda_index({"LOCAL_RANK": "1"}, device_count=2, grouped=True, model_device=torch.device("cpu")) == 1


def test_a_process_shown_a_single_gpu_uses_it_whatever_its_local_rank():
    """A launcher that sets CUDA_VISIBLE_DEVICES per process leaves each one device 0."""
    assert local_cuda_index({"LOCAL_RANK": "5"}, device_count=1, grouped=True) == 0


def test_a_local_rank_beyond_the_node_gpus_is_an_error_naming_the_fix():
    """LOCAL_RANK 4 on a 4-GPU node: more processes than GPUs, said with the torchrun option to change."""
    with pytest.raises(ValueError, match=r"LOCAL_RANK=4 .* sees 4 .*--nproc-per-node=4"):
        local_cuda_index({"LOCAL_RANK": "4"}, device_count=4, grouped=True)


def test_a_local_rank_that_is_not_an_integer_is_an_error():
    """A garbled LOCAL_RANK is named, not silently ignored."""
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer"):
        local_cuda_index({"LOCAL_RANK": "one"}, device_count=2, grouped=True)


def test_on_a_machine_without_cuda_the_loop_leaves_cuda_untouched(monkeypatch):
    """With LOCAL_RANK set but no GPU, nothing is made current and CUDA is never initialized."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the decision is tested above")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert use_local_cuda_device(torch.nn.Linear(2, 2)) is None
    assert not torch.cuda.is_initialized()


def test_a_model_on_another_gpu_than_local_rank_is_called_a_probable_mistake():
    """model.cuda() before set_device puts rank 1's model on cuda:0: said, with the fix."""
    problem = misplaced_model({"LOCAL_RANK": "1"}, device_count=2, grouped=True, model_device=torch.device("cuda", 0))
    assert problem.startswith("the model is on cuda:0 but LOCAL_RANK=1 names cuda:1")
    assert "torch.cuda.set_device(local_rank)" in problem


def test_a_model_where_local_rank_says_or_a_single_visible_gpu_is_no_mistake():
    """The model on LOCAL_RANK's GPU, a process shown one GPU, a model on the CPU, or no group: nothing to say."""
    cuda = torch.device("cuda", 0)
    assert misplaced_model({"LOCAL_RANK": "0"}, device_count=2, grouped=True, model_device=cuda) is None
    assert misplaced_model({"LOCAL_RANK": "1"}, device_count=1, grouped=True, model_device=cuda) is None
    assert misplaced_model({"LOCAL_RANK": "1"}, device_count=2, grouped=True, model_device=torch.device("cpu")) is None
    assert misplaced_model({"LOCAL_RANK": "1"}, device_count=2, grouped=False, model_device=cuda) is None
