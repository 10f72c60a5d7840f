"""Process group and megatron model-parallel state for one trainer process, owned (and torn down) by `ParallelContext`.

- A rank of a trainer group (rollout/trainer_group.py): the process group is already initialized by the group (its
  world is tp x dp x pp ranks); megatron's TP / DP groups are carved out of it here.
- Launched by torchrun (WORLD_SIZE in the environment): joins that world (`env://`), NCCL on GPUs, gloo on CPU.
- Otherwise: a world of one process, gloo, rendezvous through a file in a private temp dir (no TCP port to collide
  with other users of a shared machine).
megatron's parallel state is process-global: one ParallelContext (so one MegatronTrainer) per process at a time.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from train.backends import megatron_cpu

log = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} but torch sees no CUDA device; use device='cpu' or 'auto'")
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: the megatron backend runs on 'cpu' or 'cuda'")
    return d


@dataclass
class ParallelContext:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    owns_process_group: bool = False
    _tmpdir: str | None = None

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def tp_group(self):
        from megatron.core import parallel_state

        return parallel_state.get_tensor_model_parallel_group()

    @property
    def tp_rank(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_tensor_model_parallel_rank()

    @property
    def dp_group(self):
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_group()

    @property
    def dp_rank(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_rank()

    def close(self) -> None:
        """Tear down megatron's parallel state and, if we created it, the process group."""
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if self.device.type == "cpu":
            megatron_cpu.remove_cpu_shims()  # leave torch.cuda as we found it
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_process_group = False
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def init_parallel(tp: int = 1, pp: int = 1, device: str = "auto", seed: int = 0, dp: int = 1) -> ParallelContext:
    """Join (or create) the process group and initialize megatron's TP / PP / DP groups for `tp` x `pp` x `dp`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state, tensor_parallel

    dev = resolve_device(device)
    ctx = ParallelContext(tp=tp, pp=pp, dp=dp, device=dev, seed=seed)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if "WORLD_SIZE" in os.environ:
            if dev.type == "cuda":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, init_method="env://")
        else:
            ctx._tmpdir = tempfile.mkdtemp(prefix="nextstate-megatron-pg-")
            dist.init_process_group(
                backend, init_method=f"file://{ctx._tmpdir}/rendezvous", rank=0, world_size=1
            )
        ctx.owns_process_group = True
    world = dist.get_world_size()
    if world != tp * pp * dp:
        ctx.close()
        raise ValueError(
            f"world size {world} != tp {tp} x pp {pp} x dp {dp}: `python -m rollout.launch` starts the ranks itself "
            f"(a Ray actor group of tp x dp x pp ranks); standalone, launch exactly that many processes"
        )
    if parallel_state.model_parallel_is_initialized():
        if (
            parallel_state.get_tensor_model_parallel_world_size() != tp
            or parallel_state.get_pipeline_model_parallel_world_size() != pp
        ):
            raise RuntimeError("megatron model parallel state is already initialized with other sizes in this process")
    else:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    if dev.type == "cpu":
        megatron_cpu.apply_cpu_shims()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    log.info("megatron parallel state: world %d, tp %d, pp %d, dp %d, device %s", world, tp, pp, dp, dev)
    return ctx
