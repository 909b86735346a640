# Source on the GPU host before starting vLLM 0.32 from /tmp/site032.
export PYTHONPATH=/tmp/site032${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# FlashInfer is not in the wheel set; vLLM's sampler assumes it is installed unless this is off.
export VLLM_USE_FLASHINFER_SAMPLER=0
# Multi-GPU hosts: NVLink multicast stays off (it can take the shared GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
