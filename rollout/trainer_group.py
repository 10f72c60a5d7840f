"""Trainer ranks as a Ray actor group in one placement group (the way slime and verl place their Megatron workers).

A trainer of one rank (`dp_size x tp_size x pp_size == 1`) runs in the launcher's process. More ranks run as Ray actors,
one bundle each in a placement group (one GPU and `rank_num_cpus` CPUs per rank on cuda; CPUs only on the CPU), and form
one torch.distributed world (NCCL on GPUs, gloo on the CPU; rank 0 hosts its TCPStore on a port the OS picks, so
nothing collides on a shared machine). Each rank holds its backend trainer (train/backends), built from the same weights.

`TrainerGroup` is itself a Trainer: the loop calls it as it calls an in-process trainer, and every call goes to all
ranks at once (each backend is written SPMD: collectives inside, rank 0 writes files). A step's batch is put in Ray's
object store once and every rank reads it; data-parallel ranks then train their shard of it
(train/backends/data_parallel.py), gradients are reduced, and the weights for the weight sync are gathered from the
shards on rank 0 (`state_dict`, memory sync) or written by rank 0 (`export_weights`, disk sync for servers).

`TrainerPlacement` is the plan of it, made by rollout/build.py for the run and for its dry run alike.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.backends import Trainer
from train.config import MegatronTrainerConfig, TorchTrainerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerPlacement:
    """Where a trainer's ranks run: the parallel layout and the placement group that holds them."""

    backend: str  # torch | megatron
    tp: int
    dp: int
    pp: int
    device: str  # the trainer's: auto (a GPU per rank where the cluster has GPUs) | cpu | cuda
    num_cpus: float  # per rank
    strategy: str  # Ray placement strategy

    @classmethod
    def of(cls, backend: str, config: TorchTrainerConfig | MegatronTrainerConfig) -> TrainerPlacement:
        return cls(backend=backend, tp=getattr(config, "tp_size", 1), dp=config.dp_size,
                   pp=getattr(config, "pp_size", 1), device=config.device, num_cpus=config.rank_num_cpus,
                   strategy=config.placement_strategy)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def in_process(self) -> bool:
        """One rank: the trainer runs in the launcher's process (no Ray)."""
        return self.world_size == 1

    def bundles(self, gpus: bool) -> list[dict[str, float]]:
        bundle = {"CPU": float(self.num_cpus), **({"GPU": 1.0} if gpus else {})}
        return [dict(bundle) for _ in range(self.world_size)]

    def describe(self) -> str:
        layout = f"tp {self.tp} x dp {self.dp} x pp {self.pp}" if self.backend == "megatron" else f"dp {self.dp}"
        if self.in_process:
            return f"1 rank in the launcher's process ({layout}, device {self.device})"
        gpu = {"cuda": "1 GPU + ", "cpu": "", "auto": "1 GPU (where the cluster has GPUs; else CPU only) + "}
        comm = {"cuda": "NCCL", "cpu": "gloo", "auto": "NCCL on GPUs, gloo on CPU"}[self.device]
        return (f"{self.world_size} ranks ({layout}) as Ray actors in one placement group, {self.strategy}: "
                f"{gpu[self.device]}{self.num_cpus:g} CPU per rank, {comm}")


def check_placement(placement: TrainerPlacement, model_config: Mapping[str, Any] | None) -> str:
    """What the ranks need of the model, checked before anything starts (the run and its dry run call it):
    megatron trains text Qwen3 models only, and its TP-split dimensions must divide by tp_size. `model_config` is the
    model's config.json (None: not known yet). Returns what was checked."""
    if model_config is None or placement.backend != "megatron":
        return "model shape not checked" if model_config is None else "no split dimensions (data parallel)"
    if model_config.get("vision_config") is not None:
        raise ValueError(
            f"trainer=megatron trains text models; {model_config.get('model_type')!r} is a vision-language model: "
            "use trainer=torch (trainer.dp_size / trainer.dp_mode=fsdp for several GPUs)"
        )
    text = model_config.get("text_config") or model_config
    heads = int(text.get("num_attention_heads") or 0)
    checks = {"num_key_value_heads": int(text.get("num_key_value_heads") or heads),
              "intermediate_size": int(text.get("intermediate_size") or 0)}
    for name, n in checks.items():
        if n and n % placement.tp:
            raise ValueError(f"{name}={n} of the model is not divisible by trainer.tp_size={placement.tp}")
    return f"kv heads {checks['num_key_value_heads']}, intermediate {checks['intermediate_size']} divide by tp {placement.tp}"


def local_capacity() -> dict[str, float]:
    """What a local Ray instance (rollout.farm.core.init_ray without an address) offers on this machine: its CPUs (at
    least 2, as init_ray starts it) and the NVIDIA GPUs the driver lists (read from /proc: no torch import)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return {"CPU": float(max(os.cpu_count() or 2, 2)), "GPU": float(len(list(gpus.iterdir())) if gpus.is_dir() else 0)}


def check_resources(placement: TrainerPlacement, ray_address: str | None) -> str:
    """A placement on a local Ray instance must fit this machine (a cluster's resources are checked when the group
    starts). Raises with the option to change; returns what was checked."""
    if placement.in_process:
        return "in process"
    if ray_address is not None:
        return f"Ray cluster {ray_address}: resources checked when the ranks are placed"
    have = local_capacity()
    need_cpu = placement.world_size * placement.num_cpus
    if need_cpu > have["CPU"]:
        raise ValueError(
            f"the trainer's {placement.world_size} ranks reserve {need_cpu:g} CPUs ({placement.num_cpus:g} each: "
            f"trainer.rank_num_cpus) but this machine's Ray instance has {have['CPU']:g}: lower trainer.rank_num_cpus "
            "or join a cluster (farm.ray_address)"
        )
    if placement.device == "cuda" and placement.world_size > have["GPU"]:
        raise ValueError(
            f"trainer.device=cuda puts each of the {placement.world_size} ranks on its own GPU; this machine has "
            f"{have['GPU']:g}"
        )
    return f"fits this machine ({need_cpu:g} of {have['CPU']:g} CPUs)"


@dataclass
class ModelSource:
    """The weights every rank starts from: an HF directory each rank loads (servers' models), or an in-memory model
    put in Ray's object store once (the local policy's warm-started model)."""

    path: str | None = None
    model_ref: Any = None  # ray.ObjectRef of an HF model


class TrainerRank:
    """One rank of a TrainerGroup (a Ray actor): a process of the group's torch.distributed world holding one backend
    trainer. Every method is called on all ranks at once."""

    def __init__(self, rank: int, world: int, loopback: bool):
        self.rank, self.world = rank, world
        self.trainer: Trainer | None = None
        self._store = None
        if loopback:
            # a one-machine group: gloo's connections stay on the loopback interface
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.host = "127.0.0.1" if loopback else _node_ip()

    def open_store(self) -> tuple[str, int]:
        """Rank 0: host the rendezvous store on a port the OS picks; returns where the others find it."""
        import torch.distributed as dist

        self._store = dist.TCPStore(self.host, 0, self.world, is_master=True, wait_for_workers=False)
        return self.host, self._store.port

    def start(self, host: str, port: int, backend: str, config: Any, source: ModelSource, tokenizer: Any) -> dict:
        """Join the world and build this rank's trainer."""
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and config.device != "cpu"
        if cuda:
            torch.cuda.set_device(0)  # Ray gives each rank actor one GPU (CUDA_VISIBLE_DEVICES)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
        store = self._store or dist.TCPStore(host, port, self.world, is_master=False)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=self.rank, world_size=self.world)
        model = _load_source(source)
        if backend == "megatron":
            from train.backends.megatron_backend import MegatronTrainer

            self.trainer = MegatronTrainer.from_hf_model(model, config)
        else:
            from train.backends.torch_backend import TorchTrainer

            self.trainer = TorchTrainer(model, config, tokenizer)
        return {"rank": self.rank, "pid": os.getpid(), "device": "cuda" if cuda else "cpu", "host": self.host}

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.trainer, method)(*args)

    def version(self) -> int:
        return int(self.trainer.version)

    def state_dict(self) -> dict[str, Any] | None:
        """The gathered HF weights on rank 0 (every rank takes part in the gather; only rank 0 sends them back)."""
        sd = self.trainer.state_dict()
        return sd if self.rank == 0 else None

    def close(self) -> None:
        import torch.distributed as dist

        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerGroup(Trainer):
    """A Trainer over `placement.world_size` rank actors (see the module docstring)."""

    def __init__(self, ranks: list[Any], placement_group: Any, placement: TrainerPlacement):
        self.ranks, self._pg, self.placement = ranks, placement_group, placement
        self.version = 0
        self._closed = False

    @classmethod
    def start(cls, backend: str, config: Any, placement: TrainerPlacement, source: ModelSource, tokenizer: Any,
              ray_address: str | None = None, timeout_s: float = 600.0) -> TrainerGroup:
        """Place the ranks, join them into one world and build a trainer on each; fails with the cluster's resources
        when the placement group cannot be placed within `timeout_s`."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rollout.farm.core import init_ray

        check_resources(placement, ray_address)
        init_ray(ray_address)
        gpus = placement.device == "cuda" or (placement.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        bundles = placement.bundles(gpus)
        pg = placement_group(bundles, strategy=placement.strategy, name=f"nextstate-trainer-{os.getpid()}")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise RuntimeError(
                f"the trainer's placement group ({len(bundles)} bundles of {bundles[0]}, {placement.strategy}) was not "
                f"placed within {timeout_s:.0f} s; the cluster has {ray.available_resources()} available"
            ) from None
        loopback = ray_address is None  # a local Ray instance: every rank is on this machine
        actor = ray.remote(TrainerRank)
        ranks = [
            actor.options(
                num_cpus=placement.num_cpus,
                num_gpus=1 if gpus else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                name=None,
            ).remote(i, len(bundles), loopback)
            for i in range(len(bundles))
        ]
        group = cls(ranks, pg, placement)
        try:
            host, port = ray.get(ranks[0].open_store.remote(), timeout=timeout_s)
            infos = ray.get([r.start.remote(host, port, backend, config, source, tokenizer) for r in ranks],
                            timeout=timeout_s)
        except BaseException:
            group.close()
            raise
        log.info("trainer group: %s; ranks %s", placement.describe(), [(i["rank"], i["device"], i["pid"]) for i in infos])
        return group

    # ----- the Trainer protocol: every call on every rank -----
    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        if self._closed:
            raise RuntimeError("the trainer group is closed")
        return ray.get([r.call.remote(method, *args) for r in self.ranks])

    def train_step(self, batch: list[Any]) -> dict[str, float]:
        import ray

        ref = ray.put(batch)  # the batch goes to the object store once; every rank reads it (and takes its shard)
        metrics = self._all("train_step", ref)[0]
        self.version = int(metrics.get("version", self.version))
        return {**metrics, "ranks": float(self.placement.world_size)}

    def export_weights(self, path: str) -> str:
        return self._all("export_weights", str(path))[0]

    def state_dict(self) -> dict[str, Any]:
        import ray

        return ray.get([r.state_dict.remote() for r in self.ranks])[0]

    def compute_logprobs(self, samples: list[Any], reference: bool = False) -> list[list[float]]:
        import ray

        return self._all("compute_logprobs", ray.put(samples), reference)[0]

    def compute_topk(self, samples: list[Any], k: int, reference: bool = False) -> list[Any]:
        import ray

        return self._all("compute_topk", ray.put(samples), k, reference)[0]

    def save_checkpoint(self, directory: str | Path) -> Path:
        return Path(self._all("save_checkpoint", str(directory))[0])

    def load_checkpoint(self, directory: str | Path) -> None:
        import ray

        self._all("load_checkpoint", str(directory))
        self.version = ray.get(self.ranks[0].version.remote())

    def close(self) -> None:
        """Close every rank's trainer and process group, then kill the actors and free the placement group."""
        if self._closed:
            return
        self._closed = True
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            ray.get([r.close.remote() for r in self.ranks], timeout=60)
        except Exception:
            log.warning("closing the trainer ranks failed; killing them", exc_info=True)
        for r in self.ranks:
            ray.kill(r, no_restart=True)
        remove_placement_group(self._pg)


def _load_source(source: ModelSource) -> Any:
    if source.path:
        from train.hf_models import load_model

        return load_model(source.path)
    import ray

    return ray.get(source.model_ref) if isinstance(source.model_ref, ray.ObjectRef) else source.model_ref


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return socket.gethostbyname(socket.gethostname())


__all__ = ["ModelSource", "TrainerGroup", "TrainerPlacement", "TrainerRank", "check_placement", "check_resources",
           "local_capacity"]
