"""Installing graphdist: the base install (no extras) runs on ONNX Runtime; asking for what an extra provides
(the tvm backend, MetaSchedule tuning, MPI) names the extra; a wheel installs into a fresh venv and its
``graphdist`` works from any directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Makes the named top-level packages unimportable, as in an install without the extras.
_BLOCKER = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, _Missing())
"""


def _run_without(blocked: set[str], body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = _BLOCKER.format(blocked=blocked) + textwrap.dedent(body)
    env = dict(os.environ, GRAPHDIST_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    env.pop("GRAPHDIST_TVM_TUNE", None)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_base_install_runs_on_ort_and_names_the_extras(tmp_path: Path) -> None:
    result = _run_without({"tvm", "tvm_ffi", "mpi4py", "xgboost", "psutil", "cloudpickle", "sklearn", "scipy"}, """
        import numpy as np
        import graphdist as gd

        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
        with strategy.scope():
            model = gd.keras.Sequential([gd.keras.layers.Dense(2, input_shape=(3,))])
        model.compile(loss="mse", optimizer="sgd")
        history = model.fit(np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32), verbose=0)
        print("fit on ort:", np.isfinite(history.history["loss"][0]))
        for name, attempt in [
            ("tvm", lambda: gd.function(lambda x: x * 2, backend="tvm")(np.ones(2, np.float32))),
            ("mpi", lambda: gd.MultiWorkerMirroredStrategy(cluster_resolver=gd.cluster_resolver.SimpleClusterResolver(
                gd.cluster_resolver.ClusterSpec({"worker": ["h:1", "h:2"]}), task_type="worker", task_id=0))),
        ]:
            try:
                attempt()
                print(name, "did not raise")
            except gd.GraphdistError as err:
                print(name, type(err).__name__, err)
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "fit on ort: True"
    assert lines[1].startswith("tvm BackendError") and "pip install 'graphdist[tvm]'" in lines[1]
    assert lines[2].startswith("mpi GraphdistError") and "pip install 'graphdist[mpi]'" in lines[2]
    assert "Traceback" not in result.stderr


def test_tuning_without_the_tune_extra_names_it(tmp_path: Path) -> None:
    result = _run_without({"xgboost"}, """
        import os
        os.environ["GRAPHDIST_TVM_TUNE"] = "4"
        import numpy as np
        import graphdist as gd
        try:
            gd.function(lambda x: np.tanh(x) * 3, backend="tvm")(np.ones(4, np.float32))
            print("did not raise")
        except gd.GraphdistError as err:
            print(type(err).__name__, err)
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "BackendError" in result.stdout and "pip install 'graphdist[tune]'" in result.stdout
    assert "xgboost" in result.stdout


def _source_copy(destination: Path) -> Path:
    """The files a wheel is built from, copied so the build leaves nothing in the repository."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, destination / name)
    shutil.copytree(REPO / "graphdist", destination / "graphdist", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return destination


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_from_anywhere(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    source = _source_copy(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("graphdist-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], capture_output=True,
                             text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean_env["GRAPHDIST_CACHE_DIR"] = str(tmp_path / "cache")
    for command in ([str(env_dir / "bin" / "graphdist"), "devices"], [str(python), "-m", "graphdist", "devices"]):
        result = subprocess.run(command, cwd=elsewhere, env=clean_env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "cpu:0" in result.stdout and "ort " in result.stdout
        assert "pip install 'graphdist[tvm]'" in result.stdout  # the base install has no tvm, and says how
    check = subprocess.run(
        [str(python), "-c", "import graphdist, pathlib, numpy as np; "
         "print(pathlib.Path(graphdist.__file__).parent.joinpath('py.typed').exists()); "
         "print(graphdist.OneDeviceStrategy('cpu:0').run(lambda x: x * 2, args=(np.ones(2, np.float32),)))"],
        cwd=elsewhere, env=clean_env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.split("\n")[:2] == ["True", "[2. 2.]"]
    assert str(REPO) not in check.stdout + check.stderr
    # graphdist/passes and graphdist/models install under the graphdist namespace, never as top-level packages.
    layout = subprocess.run(
        [str(python), "-c", "import graphdist.passes.replicate, graphdist.models.mlp, importlib.util; "
         "print(importlib.util.find_spec('passes'), importlib.util.find_spec('models'))"],
        cwd=elsewhere, env=clean_env, capture_output=True, text=True, timeout=120)
    assert layout.returncode == 0, layout.stderr
    assert layout.stdout.split() == ["None", "None"]


def test_the_demo_needs_only_the_data_extra(tmp_path: Path) -> None:
    # `make demo` installs graphdist with [data] only; every other extra and the test tools are absent here.
    # (cloudpickle stays: scikit-learn's joblib needs it, so [data] installs it too.)
    result = _run_without({"tvm", "tvm_ffi", "mpi4py", "mpich", "xgboost", "psutil", "pytest",
                           "xdist", "ruff", "importlinter", "pdoc"}, """
        import sys
        from graphdist.models import demo
        sys.exit(demo.main(["--save", "model", "--no-compare"]))
        """, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "OK: accuracy >= 0.95" in result.stdout
    demo_recipe = (REPO / "Makefile").read_text().split("$(DEMO_STAMP): $(PY) pyproject.toml\n", 1)[1].split("\n\n")[0]
    assert "-e '.[data]'" in demo_recipe and "[test" not in demo_recipe
