"""What a start that hangs reports, and the ending of what it made (`rollout/engine/start_report.py`), on a real
child process and a real waiting thread."""

import multiprocessing
import threading
import time

from lit_asyncrl.rollout.engine.start_report import end_processes, processes_made_since, where_the_start_stands
from tests.support.xdist_groups import imports_vllm


def _waiting_thread(release: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=release.wait, name="starting", daemon=True)
    thread.start()
    return thread


def test_the_report_names_the_threads_frames_and_each_new_process_and_ending_kills_them():
    context = multiprocessing.get_context("fork")
    older = context.Process(target=time.sleep, args=(30,), name="Older")
    older.start()
    before = set(multiprocessing.active_children())
    made = context.Process(target=time.sleep, args=(30,), name="EngineCore")
    made.start()
    release = threading.Event()
    thread = _waiting_thread(release)
    try:
        new = processes_made_since(before)
        assert new == [made]  # the process alive before the start is not the start's
        time.sleep(0.2)  # the child is asleep by now
        report = where_the_start_stands(thread, new)
        assert report.startswith("the starting thread was at threading.py:")
        assert " wait <- " in report  # Event.wait, innermost first
        assert f"; its process {made.pid} (EngineCore, titled " in report
        assert "was in state S, waiting in " in report

        end_processes(new)
        made.join(timeout=5)
        assert made.exitcode == -9 and older.is_alive()
    finally:
        release.set()
        for process in (older, made):
            process.kill()
            process.join(timeout=5)


def test_a_finished_thread_and_a_gone_process_are_said_so():
    context = multiprocessing.get_context("fork")
    gone = context.Process(target=time.sleep, args=(0,), name="EngineCore")
    gone.start()
    gone.join(timeout=5)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()

    assert where_the_start_stands(thread, [gone]) == (
        f"the starting thread is gone; its process {gone.pid} (EngineCore) is gone"
    )
    assert where_the_start_stands(None, []) == "the starting thread is gone"


@imports_vllm
def test_an_engine_whose_making_has_not_begun_ends_no_other_process(model_path):
    from lit_asyncrl.rollout.engine.protocol import EngineStartTimeout
    from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine

    # Another engine's core, say: a child of this process that the waiting engine did not make.
    other = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), name="EngineCore")
    other.start()
    engine = VLLMEngine(model_path)  # never launched: its making has not begun
    try:
        try:
            engine.wait_until_serving(timeout_s=0.01)
        except EngineStartTimeout as timeout:
            assert str(timeout) == "vLLM engine did not start within 0.01 s (the starting thread is gone)"
        else:
            raise AssertionError("no EngineStartTimeout")
        assert other.is_alive()
    finally:
        engine.shutdown()
        other.kill()
        other.join(timeout=5)
