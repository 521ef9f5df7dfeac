"""Markers `cuda`, `ort_cuda` and `tensorrt`, defined once: tests carrying them skip with
the reason. Each process of the run (each pytest-xdist worker) gets its own decision cache
and one intra-op thread; each runs its own redis-server where a test asks for one."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests import file_order

# Remembered decisions (chain.memory) stay off in the suite: a test must see a selection,
# not an earlier test's winner. tests/test_memory.py turns them on where it means to.
os.environ["CHAIN_MEMORY"] = "0"
# Nor do inductor winners build AOTInductor packages in the background (a second compile
# each): tests/test_inductor_package.py turns them on in the processes it starts.
os.environ["CHAIN_INDUCTOR_PACKAGE"] = "0"
# no default background challengers (inductor compiles beside every test's selections);
# the tests of the run-time race name theirs (chain.select.challenge)
os.environ["CHAIN_CHALLENGERS"] = "none"


def pytest_configure(config: pytest.Config) -> None:
    """Each process of the run (each pytest-xdist worker) remembers into a cache of its own,
    never the user's `~/.cache` nor another worker's. And torch runs one intra-op thread, in
    the processes the tests start too: the suite's models are tiny, and a second thread
    waiting for a busy core (another worker's, another job's) stalls each call for
    milliseconds (300 calls of the test MLP: 20.8 s with 2 threads on a loaded 2-core
    machine, 0.9 s with 1)."""
    cache = tempfile.mkdtemp(prefix="chain-tests-")
    os.environ["CHAIN_CACHE_DIR"] = cache
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    # files go to the workers heaviest first (tests/file_order.py), not by count of tests
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def _ort_cuda_reason() -> str | None:
    """Why ONNX Runtime cannot run on CUDA here: no device, or a build without the CUDA EP."""
    no_device = _cuda_reason()
    if no_device:
        return no_device
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return (
            "this onnxruntime has no CUDAExecutionProvider "
            f"({', '.join(onnxruntime.get_available_providers())}): "
            "pip install 'backend-chain[gpu]'"
        )
    return None


def _tensorrt_reason() -> str | None:
    """The device first: without one, installing TensorRT cannot help."""
    no_device = _cuda_reason()
    if no_device:
        return no_device
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed: pip install 'backend-chain[gpu]'"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = {"cuda": _cuda_reason, "ort_cuda": _ort_cuda_reason, "tensorrt": _tensorrt_reason}
    cache: dict[str, str | None] = {}
    for item in items:
        for marker, probe in reasons.items():
            if item.get_closest_marker(marker) is not None:
                if marker not in cache:
                    cache[marker] = probe()
                if cache[marker]:
                    item.add_marker(pytest.mark.skip(reason=cache[marker]))
    file_order.heaviest_first(items, file_order.weights())


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """Each test compiles from scratch: no graphs cached from an earlier test, and no
    threads seen calling them (chain.run.callers)."""
    from chain.run import callers

    torch._dynamo.reset()
    callers.reset()


@pytest.fixture(params=["fast", "general"])
def guard_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs a test on each of the guard's two paths for a watched call: the fast closure
    (chain.run.watch.fast), which must then have been built for at least one winner, and the
    general path alone. Both must reach the same verdicts."""
    import chain.run.guard

    built: list[Any] = []
    real = chain.run.guard.fast_path

    def recorded(watch: Any, fn: Any) -> Any:
        fast = real(watch, fn) if request.param == "fast" else None
        built.append(fast)
        return fast

    monkeypatch.setattr(chain.run.guard, "fast_path", recorded)
    yield request.param
    if request.param == "fast":
        assert any(f is not None for f in built), "no winner took the fast path"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real redis-server for this test process (each xdist worker starts its own, on a
    free port, in its own folder, no persistence); its port. Test modules take a database
    each (`redis_url`). Skipped where none can start."""
    pytest.importorskip("redis", reason="the redis client: pip install 'backend-chain[fleet]'")
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    from tests.helpers import free_port

    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    proc = subprocess.Popen(
        [binary, "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None:
                pytest.skip(f"redis-server did not start: {proc.stderr.read().decode()[-300:]}")
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.skip("redis-server did not answer within 5 s")
    yield port
    proc.terminate()
    proc.wait(timeout=10)
