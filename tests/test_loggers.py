"""run.loggers: metrics rows as TensorBoard scalars (read back with TensorBoard's own reader; a resume purges what the
superseded attempt logged) and as a W&B run (offline mode, read back from its files)."""

from __future__ import annotations

import json

import pytest

from rollout.loggers import Loggers, TensorBoardLogger, WandbLogger, WandbOptions, check_loggers, scalars

ROWS = [
    {"kind": "eval", "iteration": 0, "accuracy": 0.25, "episodes": 4, "farm/restarts": 0},
    {"kind": "train", "iteration": 0, "accuracy": 0.5, "train/loss": 1.5, "weight_sync": "memory",
     "judge/unanimous_fraction": None, "judge/invalid_vote_rate": 0.1},
    {"kind": "resume", "resume": 1, "from_iteration": 1},
    {"kind": "train", "iteration": 1, "accuracy": 0.75, "train/loss": 1.25, "judge/invalid_vote_rate": 0.0},
]


def test_scalars_tag_by_kind_and_leave_out_text_and_nulls():
    step, values = scalars(ROWS[1])
    assert step == 0 and values == {"train/accuracy": 0.5, "train/loss": 1.5, "train/judge/invalid_vote_rate": 0.1}
    assert scalars(ROWS[0])[1]["eval/accuracy"] == 0.25 and scalars(ROWS[2]) is None
    with pytest.raises(ValueError, match="unknown \\['tensorbord'\\]"):
        check_loggers(["tensorbord"])


def _events(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path))
    acc.Reload()
    return acc


def test_tensorboard_events_read_back_and_a_resume_purges_the_superseded_steps(tmp_path):
    import tensorboard  # noqa: F401 (the loggers extra, always installed: a broken one fails)
    tb = TensorBoardLogger(tmp_path, "run:\n  name: x\n")
    for row in ROWS:
        tb.log(row)
    tb.log({"kind": "train", "iteration": 2, "accuracy": 0.0})  # the attempt that gets killed and superseded
    tb.close()
    acc = _events(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("train/accuracy")] == [(0, 0.5), (1, 0.75), (2, 0.0)]
    assert "config/text_summary" in acc.Tags()["tensors"]
    # resumed at iteration 1: steps >= 1 of the first attempt are purged; the kept rows at step >= 1 come again
    again = TensorBoardLogger(tmp_path, "", purge_step=1, kept_rows=[ROWS[0], ROWS[1]])
    again.log({"kind": "train", "iteration": 1, "accuracy": 0.8})
    again.log({"kind": "train", "iteration": 2, "accuracy": 0.9})
    again.close()
    acc = _events(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("train/accuracy")] == [(0, 0.5), (1, pytest.approx(0.8)),
                                                                          (2, pytest.approx(0.9))]
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [0]


def wandb_records(path):
    """The protobuf records of a W&B run file (`run-<id>.wandb`: a 7-byte `:W&B` header, then LevelDB-log framing in
    32 KiB blocks: 4-byte checksum, 2-byte length, 1-byte type full / first / middle / last), as `wandb sync` reads
    it: the test reads what W&B wrote, not what we handed it."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def test_wandb_offline_run_gets_every_row_and_the_config(tmp_path, monkeypatch):
    import wandb  # noqa: F401 (the loggers extra, always installed: a broken one fails)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"loop": {"iterations": 2}, "run": {"name": "r"}}
    wb = WandbLogger(WandbOptions(project="nextstate-test", mode="offline"), tmp_path, "r", config, None)
    loggers = Loggers([("wandb", wb)])
    for row in ROWS:
        loggers.log(row)
    run_id = wb.id
    loggers.close()
    run_dirs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(run_dirs) == 1
    from wandb.proto import wandb_internal_pb2

    history, configs = [], []
    for data in wandb_records(next(run_dirs[0].glob("*.wandb"))):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in rec.history.item})
        elif rec.WhichOneof("record_type") in ("run", "config"):  # the config goes with the run record
            updates = rec.run.config.update if rec.WhichOneof("record_type") == "run" else rec.config.update
            configs += [(u.key, json.loads(u.value_json)) for u in updates]
    assert [(h["iteration"], h.get("train/accuracy"), h.get("eval/accuracy")) for h in history] == [
        (0, None, 0.25), (0, 0.5, None), (1, 0.75, None)]
    assert ("loop", {"iterations": 2}) in configs


def test_a_failing_logger_is_dropped_not_the_run(caplog):
    class Broken:
        def log(self, row):
            raise OSError("disk full")

        def close(self):
            pass

    seen = []

    class Fine:
        def log(self, row):
            seen.append(row)

        def close(self):
            pass

    loggers = Loggers([("broken", Broken()), ("fine", Fine())])
    for row in ROWS:
        loggers.log(row)
    assert len(seen) == len(ROWS) and [n for n, _ in loggers.loggers] == ["fine"]
    assert "logger broken failed (OSError: disk full)" in caplog.text
