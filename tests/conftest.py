import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Engines compile their narrow passes by default (mulo.compiled), ~20 s a package on two cores:
# the suite runs eagerly but for tests/test_compiled.py, which asks for compiling and checks that
# the tokens do not change; the app and CLI subprocesses the tests start inherit this.
os.environ.setdefault("MULO_COMPILE", "off")
# Wide passes (mulo.wide) stay float32 in the suite: an AMX machine would otherwise measure and pick
# bfloat16, and the pinned tokens would move; tests/test_wide.py forces each precision itself.
os.environ.setdefault("MULO_WIDE_PRECISION", "float32")
# bf16 passes under autocast unless a test asks for compiled layers (mulo.fused_layers): no compile per test
os.environ.setdefault("MULO_WIDE_FUSED", "0")
# Under pytest-xdist (the README's `-n 2`) each of the two workers takes one core: one torch thread
# each, and the processes they start (CLI, app, device rehearsal) inherit one OpenMP thread. Two
# workers of two threads each oversubscribe the two cores (the fast tier did not end in 10 min).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    torch.set_num_threads(1)
else:
    torch.set_num_threads(min(2, torch.get_num_threads()))

# Tar's golden references (tiny random checkpoints and the original code's outputs on them), kept in
# the repository so a clone alone runs every test: tests/data/golden_tar/PROVENANCE.md.
GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden_tar")


@pytest.fixture(scope="session")
def toy():
    from mulo.families import toy

    return toy.build()


@pytest.fixture(scope="session")
def engine(toy):
    from mulo.engine import Engine

    return Engine(toy)


@pytest.fixture(scope="session")
def golden_dir():
    path = os.path.abspath(GOLDEN)
    if not os.path.isdir(path):
        pytest.fail(f"golden reference data missing at {path} (a partial checkout?)")
    return path
