"""The vision-language policy: a tiny Qwen3-VL built from config with transformers' own classes (no download) sees
screenshots; the trainer recomputes the logprobs of exactly what it sampled (same ids, same pixels) and trains on them.

The chain under test is the one a GUI run uses: messages whose observations carry an H x W x 3 uint8 "image" ->
`LocalPolicy` with a `VisionProcessor` (placeholders expanded per merged patch, the images processed) -> the batched
sampler with multimodal RoPE positions -> `Completion.vision` -> `Step` -> `build_samples` -> `TorchTrainer`.
"""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch

from rollout.policy.base import SamplingParams
from rollout.policy.build import vision_policy_model
from rollout.policy.local import LocalPolicy
from rollout.policy.local_config import LocalPolicyConfig, LocalPolicyOptions
from train.backends.torch_backend import TorchTrainer
from train.config import TorchTrainerConfig, VisionConfig
from train.records import Step, Trajectory
from train.sample_layout import build_samples
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from train.vision import IMAGE_PAD, VisionProcessor, vision_messages
from toy_conversations import addition_conversations

TOL = 1e-4


def screenshot(seed: int, h: int = 800, w: int = 1280) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def vl():
    tok = build_tokenizer([render_chat(c) for c in addition_conversations(40)], vocab_size=320)
    text = build_model(tiny_qwen3_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id), 1)
    options = LocalPolicyOptions(vision=VisionConfig(enabled=True, max_images=2))
    model, processor = vision_policy_model(text, tok, options, seed=2)
    return model, processor, text, tok


def episode(steps: int) -> list[list[dict]]:
    """The prompts of one GUI-like episode: each observation a new screenshot."""
    msgs: list[dict] = [{"role": "system", "content": "You control a desktop."},
                        {"role": "user", "content": "Open the editor.", "image": screenshot(0)}]
    out = [list(msgs)]
    for t in range(1, steps):
        msgs += [{"role": "assistant", "content": f"pyautogui.click({10 * t}, 20)"},
                 {"role": "user", "content": f"step {t}: the screen changed", "image": screenshot(t)}]
        out.append(list(msgs))
    return out


def test_the_model_is_transformers_qwen3_vl_and_text_ids_keep_their_meaning(vl):
    model, processor, text, tok = vl
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert len(processor) == len(tok) + 4 and model.config.text_config.vocab_size == len(processor)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    ids, vision = processor.prompt(msgs)
    assert vision is None and ids == list(tok.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"])
    with torch.no_grad():  # the language model is the text model's: same hidden states on text
        x = torch.tensor([ids])
        assert torch.equal(model.model(input_ids=x).last_hidden_state, text.model(input_ids=x).last_hidden_state)


def test_a_screenshot_becomes_placeholders_and_patches(vl):
    _, processor, _, _ = vl
    msgs = episode(3)[-1]
    parts, images = vision_messages(msgs, max_images=2)
    assert len(images) == 2 and all(isinstance(p["content"], str) for p in parts[:3])  # the oldest keeps its text
    ids, vision = processor.prompt(msgs)
    grid = vision.image_grid_thw
    assert vision.num_images == 2 and grid.tolist() == [[1, 10, 16], [1, 10, 16]]  # 1280x800 -> 128x80 at patch 8
    assert ids.count(processor.image_token_id) == int(grid.prod(-1).sum()) // 4  # one token per 2x2 merged patch
    assert vision.pixel_values.shape == (int(grid.prod(-1).sum()), 3 * 2 * 8 * 8)
    text, imgs = processor.render(msgs)
    assert text.count(IMAGE_PAD) == 2 and len(imgs) == 2
    with pytest.raises(ValueError, match="H x W x 3 uint8"):
        processor.prompt([{"role": "user", "content": "x", "image": np.zeros((4, 4), np.uint8)}])


def test_the_trainer_recomputes_the_samplers_logprobs_and_trains_on_the_screenshots(vl, tmp_path):
    model, processor, _, _ = vl
    policy = LocalPolicy(copy.deepcopy(model), processor.tokenizer, LocalPolicyConfig(seed=0), vision=processor)
    prompts = episode(3)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)

    async def play():
        # all turns of two episodes in one sampler batch (different lengths and image counts: left padding)
        return await asyncio.gather(*(policy.generate(m, sampling) for m in prompts + prompts[:1]))

    completions = asyncio.run(play())
    asyncio.run(policy.close())
    assert all(c.vision is not None for c in completions)
    assert [c.vision.num_images for c in completions] == [1, 2, 2, 1]
    traj = Trajectory("r", "e", "g", "t")
    for i, c in enumerate(completions[:3]):
        traj.steps.append(Step("r", "e", "g", "t", i, c.text, {"role": "user", "content": ""}, {},
                               advantage=1.0 if i % 2 else -1.0, prompt_ids=c.prompt_ids, output_ids=c.output_ids,
                               output_logprobs=c.output_logprobs, vision=c.vision))
    samples, stats = build_samples([traj], "trajectory")
    assert stats.fallback_trajectories == 1 and len(samples) == 3  # max_images=2: the oldest image leaves the prompt
    assert all(s.vision is c.vision for s, c in zip(samples, completions))
    trainer = TorchTrainer(copy.deepcopy(model), TorchTrainerConfig(lr=1e-3, micro_batch_tokens=200), processor)
    recomputed = trainer.compute_logprobs(samples)
    for s, lp in zip(samples, recomputed):
        n = len(s.tokens) - len(s.rollout_logprobs[: s.spans[0].start])
        got = lp[s.spans[0].start:]
        want = s.rollout_logprobs[s.spans[0].start:]
        assert len(got) == n and max(abs(a - b) for a, b in zip(got, want)) < TOL
    # with another screenshot the same ids score differently: the trainer really reads the pixels
    other = copy.copy(samples[0])
    other.vision = processor.prompt([{**prompts[0][0]}, {**prompts[0][1], "image": screenshot(99)}])[1]
    start = samples[0].spans[0].start
    assert max(abs(a - b) for a, b in zip(trainer.compute_logprobs([other])[0][start:], recomputed[0][start:])) > 1e-3
    metrics = trainer.train_step(samples)
    assert metrics["images"] == 5 and metrics["rollout_logprob_diff"] < TOL and metrics["micro_batches"] > 1
    visual = {k: v for k, v in trainer.model.state_dict().items() if k.startswith("model.visual")}
    before = {k: v for k, v in model.state_dict().items() if k.startswith("model.visual")}
    assert max(float((visual[k] - before[k]).abs().max()) for k in visual) > 0  # the vision tower was trained
    # the export is a complete VL model directory: a fresh policy loads it and scores the same
    out = trainer.export_weights(tmp_path / "v1")
    loaded = LocalPolicy.from_pretrained(out)
    assert loaded.vision is not None and loaded.vision.options.max_images == 2
    ids, vision = loaded.vision.prompt(prompts[1])
    assert ids == samples[1].tokens[: samples[1].spans[0].start]
    assert torch.equal(vision.pixel_values, samples[1].vision.pixel_values)
    assert isinstance(VisionProcessor.from_pretrained(out), VisionProcessor)


def test_a_prompt_over_the_limit_drops_its_oldest_turns_warns_once_and_says_its_length(vl, caplog):
    import logging

    model, processor, _, _ = vl
    long, short = episode(5)[-1], episode(3)[-1]
    full = len(processor.prompt(long)[0])
    limit = len(processor.prompt(short)[0]) + 8  # room for the task and two turns, not four
    assert full > limit
    policy = LocalPolicy(copy.deepcopy(model), processor.tokenizer, LocalPolicyConfig(seed=0, max_prompt_tokens=limit),
                         vision=processor)

    async def play():
        try:
            return [await policy.generate(long, SamplingParams(max_new_tokens=2)) for _ in range(3)]
        finally:
            await policy.close()

    with caplog.at_level(logging.WARNING, logger="rollout.policy.local"):
        outs = asyncio.run(play())
    assert all(c.prompt_truncated_from == full and len(c.prompt_ids) <= limit for c in outs)
    assert all(c.prompt_ids == processor.prompt(long[:2] + long[-4:])[0] for c in outs)  # the two oldest turns went
    said = [r.getMessage() for r in caplog.records if r.name == "rollout.policy.local"]
    assert len(said) == 1 and f"prompt of {full} tokens (images included) cut by its oldest turns" in said[0]
    assert (policy.stats.truncated_prompts, policy.stats.longest_prompt_tokens) == (3, full)


def test_the_sglang_policy_sends_text_and_image_data_and_trains_on_what_the_server_saw(vl, tmp_path):
    """An SGLang-shaped /generate backed by the tiny VL model itself, expanding the image placeholders server side
    as SGLang's multimodal processor does: the client sends `text` + `image_data` (PNG data URLs), and the prompt ids
    and images it keeps for training are the ones the server scored."""
    import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
    import base64
    import io

    from fastapi import FastAPI, Request
    from PIL import Image

    from rollout.policy.sampler import RowSampling, sample
    from rollout.policy.sglang import SGLangConfig, SGLangPolicy
    from rollout.server.app import ServerThread

    model, processor, _, _ = vl
    model_dir = tmp_path / "vl-model"
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    server_proc = VisionProcessor.from_pretrained(model_dir)  # the server's own copy of the model's processor
    seen: list[dict] = []
    app = FastAPI()

    async def generate(req):
        body = await req.json()
        seen.append(body)
        assert "input_ids" not in body  # pre-expanded ids with images: what SGLang mishandles
        images = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in body["image_data"]]
        ids, vision = server_proc.encode(body["text"], images)
        sp = body["sampling_params"]
        out = sample(model, [ids], RowSampling(temperature=sp["temperature"], max_new_tokens=sp["max_new_tokens"]),
                     stop_token_ids=[processor.tokenizer.eos_token_id], generator=torch.Generator().manual_seed(0),
                     vision=[vision])[0]
        return {"text": server_proc.tokenizer.decode(out.output_ids, skip_special_tokens=True),
                "output_ids": out.output_ids,
                "meta_info": {"finish_reason": {"type": out.finish_reason}, "prompt_tokens": len(ids),
                              "weight_version": "0",
                              "output_token_logprobs": [[lp, t, None] for lp, t in zip(out.logprobs, out.output_ids)]}}

    generate.__annotations__ = {"req": Request}  # (this module's annotations are strings FastAPI cannot resolve here)
    app.post("/generate")(generate)

    msgs = episode(2)[-1]
    with ServerThread(app) as server:
        policy = SGLangPolicy(SGLangConfig(urls=[server.url], model_path=str(model_dir), check_on_start=False,
                                           vision={"enabled": True, "max_images": 2}))

        async def one():
            try:
                return await policy.generate(msgs, SamplingParams(max_new_tokens=8), session="ep")
            finally:
                await policy.close()

        c = asyncio.run(one())
    assert len(seen) == 1 and len(seen[0]["image_data"]) == 2 and seen[0]["image_data"][0].startswith("data:image/png")
    assert seen[0]["text"].count(IMAGE_PAD) == 2
    assert c.vision is not None and c.vision.num_images == 2 and c.output_ids
    trainer = TorchTrainer(copy.deepcopy(model), TorchTrainerConfig(kl_coef=0.0), processor)
    from train.records import TrainSample

    n_p, n_o = len(c.prompt_ids), len(c.output_ids)
    s = TrainSample(c.prompt_ids + c.output_ids, [0] * n_p + [1] * n_o, [0.0] * (n_p + n_o),
                    [0.0] * n_p + c.output_logprobs, vision=c.vision)
    assert max(abs(a - b) for a, b in zip(trainer.compute_logprobs([s])[0][n_p:], c.output_logprobs)) < TOL
