"""The only shims megatron-core 0.16 needs to run forward/backward on a CPU (gloo, no CUDA). Applied only when the
trainer runs on the CPU; on a GPU nothing here is touched.

Each shim is the smallest change that gets past one hard-coded CUDA call on the path we use:

1. `torch.cuda.current_device()` -> "cpu". RotaryEmbedding.get_emb moves its `inv_freq` buffer to
   `torch.cuda.current_device()` on every forward, and the tensor-parallel layers / mappings allocate their scratch and
   gather buffers there. With a CPU-only torch that call raises "Torch not compiled with CUDA enabled"; returning the
   string "cpu" makes every such `device=` argument mean the CPU.
2. A no-op RNG tracker (`initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)`). Attention dropout runs
   inside `get_cuda_rng_tracker().fork()`, whose real implementation saves and restores *CUDA* generator states. The
   inference tracker's fork is a null context, so dropout (0 in our configs) draws from the CPU generator instead.
3. No CUDA generator state in activation recompute. megatron's `tensor_parallel.checkpoint` (recompute_granularity
   selective / full) saves and restores `torch.cuda` RNG state through `random._get_cuda_rng_state` /
   `_set_cuda_rng_state` beside the CPU generator's (which it already keeps); on the CPU those two become a `None`
   state and a no-op, so the recomputed forward replays the CPU generator exactly as on a GPU.

Not shimmed, avoided instead: `get_default_causal_mask` (device="cuda") is never reached because we always pass an
explicit causal mask; `get_megatron_optimizer` and `forward_backward_no_pipelining` (device="cuda" tensors) are not used
on CPU: the backend steps a torch.optim.AdamW and runs its own micro-batch loop there.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

_original_current_device = torch.cuda.current_device
_original_rng_state: tuple | None = None  # megatron's (_get_cuda_rng_state, _set_cuda_rng_state) while shim 3 is on
_applied = False


def _no_cuda_rng_state(*args, **kwargs) -> None:
    return None


def _set_no_cuda_rng_state(new_state, *args, **kwargs) -> None:
    return None


def _cpu_current_device() -> str:
    return "cpu"


def apply_cpu_shims() -> None:
    """Install the shims (idempotent). Call after the model-parallel state is initialized, before the first forward."""
    global _applied, _original_rng_state
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    if not _applied:
        torch.cuda.current_device = _cpu_current_device  # shim 1
        _original_rng_state = (mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state)
        mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = _no_cuda_rng_state, _set_no_cuda_rng_state  # 3
        _applied = True
        log.debug("megatron CPU shims applied: torch.cuda.current_device -> 'cpu', no-op RNG tracker, no CUDA RNG state "
                  "in recompute")
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)  # shim 2 (reset: a test may have set another)


def remove_cpu_shims() -> None:
    """Undo shims 1 and 3 and drop the no-op tracker (the next GPU init builds a real one)."""
    global _applied
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    if _applied:
        torch.cuda.current_device = _original_current_device
        mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = _original_rng_state
        _applied = False
        initialize_rng_tracker(force_reset=True)


def shims_applied() -> bool:
    return _applied
