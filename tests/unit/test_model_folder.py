"""A cached model folder is built once however many processes want it at the same time."""

import json
import multiprocessing
import time
from pathlib import Path

from lit_asyncrl.models.folder import cached_model_folder


class _SavedAsConfig:
    """Stands for a model and a tokenizer: saving writes the file a complete folder has."""

    def save_pretrained(self, folder):
        (Path(folder) / "config.json").write_text(json.dumps({"model_type": "stand-in"}))


def _want_folder(target: Path, builds: Path) -> None:
    def build():
        with open(builds, "a") as log:
            log.write("built\n")
        time.sleep(0.5)  # long enough for the other process to arrive while this one builds
        return _SavedAsConfig(), _SavedAsConfig()

    cached_model_folder(target, build)


def test_two_processes_wanting_one_folder_build_it_once_and_both_find_it_complete(tmp_path):
    target = tmp_path / "cache" / "model"
    builds = tmp_path / "builds.txt"
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_want_folder, args=(target, builds)) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=30)
    assert [process.exitcode for process in processes] == [0, 0]
    assert builds.read_text() == "built\n"
    assert json.loads((target / "config.json").read_text()) == {"model_type": "stand-in"}
    # A later caller finds the folder and builds nothing.
    cached_model_folder(target, lambda: (_ for _ in ()).throw(AssertionError("built again")))
    assert builds.read_text() == "built\n"
