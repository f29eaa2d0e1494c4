"""benchmarks/acceptance/table.py on the first GPU run's committed results."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "acceptance"))

import table  # noqa: E402

RUN1 = ROOT / "benchmarks" / "acceptance" / "results" / "2026-12-06-vllm0.20.1-h100"


def test_rows_in_loop_order_with_ratios_and_the_refusal() -> None:
    lines = table.table(RUN1).splitlines()
    names = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
    assert names == ["target", "eagle3", "dflash", "dflash-1d"]
    assert "| 0.294, 0.101, 0.037 | 1.43 | 2,527 / 70.8 | 0.66x / 0.86x |" in lines[3]
    assert "not served" in lines[4]


def test_bad_folder_is_one_line(tmp_path: Path, capsys) -> None:
    assert table.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


RUN3 = ROOT / "benchmarks" / "acceptance" / "results" / "2026-12-07-run2-vllm0.20.1-h100"


def test_validated_column_from_the_trainers_validation() -> None:
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.table(RUN3).splitlines()[2:]}
    assert rows["eagle3"].endswith("| 0.424 / 1.73 |")  # 1 + 0.424 + 0.197 + 0.104
    assert rows["dflash"].endswith("| 0.387 / 1.53 |")  # DFlash's own eal
    assert rows["eagle3-stock"].endswith("| 0.424 / 1.73 |")  # the eagle3 row's drafter
    assert rows["dflash-noncausal"].endswith("| 0.387 / 1.53 |")  # dflash's, patch off
    assert rows["target"].endswith("| - | - |")


def test_trained_but_not_served_rows_keep_their_validation() -> None:
    """Run 3 lost its machine before serving: each trainer's validation is still a row."""
    run = RUN3.parent / "2026-12-07-run3-vllm0.20.1-h100"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.table(run).splitlines()[2:]}
    assert rows["eagle3"] == "| eagle3 | not served | - | - | - | 0.594 / 2.35 |"
    assert rows["dflash"].endswith("| 0.579 / 2.22 |")
    assert rows["eagle3-hf32"].endswith("| - |")  # stopped before its first validation


# two validation epochs as speculators' trainer logs them (rich wraps the pairs), a training
# line between them that must not be read as validation
LOG = """\
           INFO     Validation epoch 1/2 started                  trainer.py:754
[10:25:59] INFO     val/loss_0_epoch=2.590,                       trainer.py:671
                    val/full_acc_0_epoch=0.272,
                    val/full_acc_1_epoch=0.084, val/loss_epoch=8.227, epoch=0
           INFO     Validation epoch 1/2 completed                trainer.py:756
[10:26:02] INFO     train/loss_0=2.523, train/full_acc_0=0.271,   trainer.py:587
                    global_step=140
           INFO     Validation epoch 2/2 started                  trainer.py:754
[10:27:01] INFO     val/full_acc_0_epoch=0.424, val/full_acc_1_epoch=0.197,
                    val/loss_epoch=4.956, epoch=1
           INFO     Validation epoch 2/2 completed                trainer.py:756
                    global_step=280, trainer/max_steps=300,
"""


def test_validation_reads_each_epoch_of_a_trainer_log(tmp_path: Path) -> None:
    import validation

    (tmp_path / "train-eagle3.log").write_text(LOG)
    (tmp_path / "train-broken.log").write_text("OutOfMemoryError: CUDA out of memory.\n")
    read = validation.read_logs(tmp_path)
    assert read["eagle3"] == {
        "last_logged_step": 280,
        "max_steps": 300,
        "validation_per_epoch": [
            {"loss_0": 2.59, "full_acc_0": 0.272, "full_acc_1": 0.084, "loss": 8.227, "epoch": 0},
            {"full_acc_0": 0.424, "full_acc_1": 0.197, "loss": 4.956, "epoch": 1},
        ],
    }
    assert read["broken"]["validation_per_epoch"] == []
    assert validation.main([str(tmp_path / "missing")]) == 2
