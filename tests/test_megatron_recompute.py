"""Activation recompute (trainer.recompute_granularity selective / full) on the CPU gloo group gives the same step as
none: loss, gradient norm, every gradient and the updated weights, with local and fused attention, while autograd
keeps fewer bytes; on two gloo ranks (TP=2, spawned as benchmarks/megatron_gpu.py spawns them) too. The distributed
optimizer is megatron's own, which megatron-core 0.16 cannot build on the CPU (it allocates on device='cuda'): what
runs here is its option reaching megatron's DDP and optimizer configs, and the clear error on the CPU path."""

from __future__ import annotations

import os
import socket
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)

from test_megatron_backend import make_samples, tiny_hf, trainer_for

from train.backends.microbatch import make_micro_batches

TOL = 1e-6  # fp32, absolute: recompute replays the same kernels on the same inputs, so this is float noise at most

RECOMPUTE = [
    {"recompute_granularity": "selective"},
    {"recompute_granularity": "full"},  # uniform, 1 layer per chunk
    {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 2},
    {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1},
]


def saved_bytes(trainer, samples) -> int:
    """Bytes autograd saves for backward in one micro-batch's forward (by storage, once each)."""
    seen: dict[int, int] = {}

    def pack(t):
        if t.device.type == "cpu":
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        return t

    (mb,) = make_micro_batches(samples, 10_000, pad_id=0)
    trainer.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = trainer._micro_batch_loss(trainer.model, mb)
    loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    return sum(seen.values())


def one_step(attention: str, **kw):
    samples = make_samples(lengths=(12, 23, 7, 16, 30))
    tr = trainer_for(tiny_hf(False), attention=attention, micro_batch_tokens=64, kl_coef=0.01, **kw)
    try:
        kept = saved_bytes(tr, samples)
        metrics = tr.train_step(samples)
        grads = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters()}
        weights = {k: v.clone() for k, v in tr.state_dict().items()}
        return metrics, grads, weights, kept
    finally:
        tr.close()


def assert_same_step(a, b) -> None:
    (ma, ga, wa, _), (mb_, gb, wb, _) = a, b
    assert abs(ma["loss"] - mb_["loss"]) < TOL and abs(ma["grad_norm"] - mb_["grad_norm"]) < TOL
    assert ga.keys() == gb.keys() and wa.keys() == wb.keys()
    for name in ga:
        assert (ga[name] - gb[name]).abs().max() < TOL, name
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() < TOL, name


@pytest.mark.parametrize("attention", ["local", "fused"])
def test_recompute_gives_the_same_step_and_keeps_fewer_bytes(attention: str):
    base = one_step(attention)
    for kw in RECOMPUTE:
        other = one_step(attention, **kw)
        assert_same_step(base, other)
        assert other[3] < base[3], (kw, other[3], base[3])  # recompute is really on: fewer saved bytes
    assert base[0]["grad_norm"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, kw: dict, path: str) -> None:
    """One gloo rank of a TP=`world` trainer: one step; rank 0 saves its metrics and the gathered HF weights."""
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), CUDA_VISIBLE_DEVICES="")
    from train.backends.megatron_backend import MegatronTrainer
    from train.config import MegatronTrainerConfig

    cfg = MegatronTrainerConfig(tp_size=world, device="cpu", micro_batch_tokens=64, kl_coef=0.01, **kw)
    with MegatronTrainer.from_hf_model(tiny_hf(False), cfg) as tr:
        metrics = tr.train_step(make_samples(lengths=(12, 23, 7, 16, 30)))
        weights = tr.state_dict()
        if rank == 0:
            torch.save({"metrics": metrics, "weights": weights}, path)


def tp2_step(tmp_path, name: str, **kw) -> dict:
    path = str(tmp_path / f"{name}.pt")
    mp.start_processes(_rank, args=(2, _free_port(), kw, path), nprocs=2, join=True, start_method="spawn")
    return torch.load(path, weights_only=False)


@pytest.mark.slow  # two ranks of megatron (40 s); one rank's recompute and megatron's TP=2 group stay in the default tier
def test_recompute_on_two_gloo_ranks_gives_the_same_step(tmp_path):
    base = tp2_step(tmp_path, "none", attention="fused")
    full = tp2_step(tmp_path, "full", attention="fused", recompute_granularity="full")
    selective = tp2_step(tmp_path, "selective", attention="local", recompute_granularity="selective")
    local = tp2_step(tmp_path, "local", attention="local")
    for a, b in ((base, full), (local, selective)):
        assert abs(a["metrics"]["loss"] - b["metrics"]["loss"]) < TOL
        assert abs(a["metrics"]["grad_norm"] - b["metrics"]["grad_norm"]) < TOL
        for k in a["weights"]:
            assert (a["weights"][k] - b["weights"][k]).abs().max() < TOL, k
    # fused vs local across the two TP ranks: the attention tolerance of tests/test_megatron_attention.py
    assert abs(base["metrics"]["loss"] - local["metrics"]["loss"]) < 1e-5


def test_distributed_optimizer_option_reaches_megatron_and_is_refused_on_the_cpu_path(monkeypatch):
    from train.config import MegatronTrainerConfig

    with pytest.raises(ValueError, match="use_distributed_optimizer=true is megatron's optimizer"):
        MegatronTrainerConfig(use_distributed_optimizer=True, optimizer="torch")
    with pytest.raises(ValueError, match="use_distributed_optimizer=true needs megatron's optimizer"):
        trainer_for(tiny_hf(False), use_distributed_optimizer=True)  # auto on a CPU: the torch optimizer
    # the megatron path's wiring, up to the point megatron-core needs CUDA: its DDP is built for real on the CPU
    # (with the distributed optimizer's sharded buffers); get_megatron_optimizer is recorded, not run (it allocates
    # torch.tensor(..., device='cuda') in MixedPrecisionOptimizer / FP32Optimizer.__init__)
    import megatron.core.optimizer as mopt

    seen = {}

    def fake_optimizer(config, models, **kw):
        seen["optimizer"], seen["ddp"] = config, models[0].ddp_config
        raise RuntimeError("stop: recorded")

    monkeypatch.setattr(mopt, "get_megatron_optimizer", fake_optimizer)
    tr = trainer_for(tiny_hf(False))
    try:
        tr.cfg.use_distributed_optimizer = True
        with pytest.raises(RuntimeError, match="stop: recorded"):
            tr._setup_megatron_optimizer()
    finally:
        tr.close()
    assert seen["optimizer"].use_distributed_optimizer and seen["ddp"].use_distributed_optimizer
    assert seen["ddp"].grad_reduce_in_fp32
