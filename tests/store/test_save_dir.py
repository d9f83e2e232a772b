"""`SaveDir` owns the save_dir's layout, cell index, locks and configuration records; nothing else spells its paths."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from steer_hydra.store import Cell, SaveDir
from steer_hydra.store import save_dir as save_dir_module

PACKAGE = Path(__file__).resolve().parents[2] / "steer_hydra"
LAYOUT_NAMES = {
    save_dir_module.LOGS_DIR,
    save_dir_module.CELLS_DIR,
    save_dir_module.CONFIGS_DIR,
    save_dir_module.PROTOCOL_DIR,
    save_dir_module.HOLDERS_DIR,
}


def test_no_module_outside_the_store_spells_a_save_dir_folder():
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "store"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in LAYOUT_NAMES:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert spelled == []


def test_a_cell_has_its_log_dir_index_and_lock_under_the_root(tmp_path):
    store = SaveDir(tmp_path / "save")
    cell = Cell("abc123", 2, "smoke")
    assert store.log_dir(cell) == tmp_path / "save" / "inspect_logs" / "abc123" / "trial_2" / "smoke"
    assert store.index_path(cell) == tmp_path / "save" / "cells" / "abc123" / "trial_2" / "smoke.json"
    assert store.cell_lock(cell) == tmp_path / "save" / "cells" / "abc123" / "trial_2" / "smoke.lock"
    assert store.config_log_dir("abc123") == store.log_dir(cell).parents[1]
    assert store.protocol_path("smoke") == tmp_path / "save" / "protocol" / "smoke.json"
    assert store.holders_dir.parent == store.protocol_path("smoke").parent


def test_logged_cells_walks_the_logs_of_the_chosen_configurations(tmp_path):
    store = SaveDir(tmp_path)
    for cell in (Cell("b", 0, "smoke"), Cell("a", 1, "smoke"), Cell("a", 0, "capability"), Cell("a", 0, "smoke")):
        store.log_dir(cell).mkdir(parents=True)
    (store.logs_root / "a" / "trial_x").mkdir()  # not a trial folder
    assert [c.cell for c in store.logged_cells()] == [
        Cell("a", 0, "capability"),
        Cell("a", 0, "smoke"),
        Cell("a", 1, "smoke"),
        Cell("b", 0, "smoke"),
    ]
    assert [c.cell for c in store.logged_cells(["b"])] == [Cell("b", 0, "smoke")]
    assert not list(SaveDir(tmp_path / "empty").logged_cells())


def test_an_index_round_trips_and_a_damaged_one_reads_as_absent_with_one_warning(tmp_path, caplog):
    store = SaveDir(tmp_path)
    cell = Cell("c", 0, "smoke")
    assert store.read_index(cell) is None
    store.write_index(cell, key="k", tasks={"t": {"log": "x.eval", "metrics": {"m": 1.0}}}, static={"s": 1})
    assert store.read_index(cell) == {
        "key": "k",
        "tasks": {"t": {"log": "x.eval", "metrics": {"m": 1.0}}},
        "static": {"s": 1},
    }
    store.index_path(cell).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert store.read_index(cell) is None
    assert sum("is damaged" in r.getMessage() for r in caplog.records) == 1
    store.index_path(cell).write_text("[1, 2]")
    assert store.read_index(cell) is None


def test_rescored_metrics_reach_the_index_only_when_it_names_that_log(tmp_path):
    store = SaveDir(tmp_path)
    cell = Cell("c", 0, "smoke")
    store.write_index(cell, key="k", tasks={"t": {"log": "a.eval", "metrics": {"m": 0.0}}}, static=None)
    assert not store.update_indexed_metrics(cell, "t", "b.eval", {"m": 1.0})
    assert not store.update_indexed_metrics(cell, "other", "a.eval", {"m": 1.0})
    assert store.read_index(cell)["tasks"]["t"]["metrics"] == {"m": 0.0}
    assert store.update_indexed_metrics(cell, "t", "a.eval", {"m": 1.0})
    assert store.read_index(cell)["tasks"]["t"]["metrics"] == {"m": 1.0}
    assert not store.update_indexed_metrics(Cell("none", 0, "smoke"), "t", "a.eval", {})


def test_configuration_records_and_the_damaged_ones_are_named(tmp_path):
    store = SaveDir(tmp_path)
    store.write_config_record({"config_id": "c1", "arm": "pasta", "arm_name": "pasta", "controls": []})
    assert store.arm_names() == {"c1": "pasta"}
    store.config_record_path("c2").write_text('{"arm": "x"}')
    store.config_record_path("c3").write_text("{")
    damaged = store.damaged_config_records()
    assert len(damaged) == 2 and "c2.json (not a configuration record" in damaged[0] and "c3.json" in damaged[1]


def test_a_scratch_file_lives_inside_the_save_dir_and_is_gone_afterwards(tmp_path):
    store = SaveDir(tmp_path)
    with store.scratch_file(".eval") as temp:
        assert temp.parent.parent == tmp_path and temp.suffix == ".eval"
        temp.write_text("x")
    assert not temp.exists() and not temp.parent.exists()


def test_a_cell_lock_excludes_a_second_holder(tmp_path):
    import fcntl

    store = SaveDir(tmp_path)
    cell = Cell("c", 0, "smoke")
    with store.locked_cell(cell), open(store.cell_lock(cell), "a+") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
