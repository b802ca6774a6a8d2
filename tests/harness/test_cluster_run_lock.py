"""One run at a time on an embedded cluster (`harness.cluster.state.run_lock`): a second
`isrlab test` on a cluster in use is refused at once, with the holder's pid and what to do,
and nothing of the first run's cluster is touched. (Found the hard way: two runs on the
default cluster wrote into each other's topics and one tore the cluster down under the
other: garbage reads and committed truncations that no fault caused.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from isrlab.harness.cluster import embedded
from isrlab.harness.cluster import state as st
from isrlab.harness.cluster.network import ClusterError


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(st, "STATE_DIR", tmp_path)
    return tmp_path


def test_a_second_run_is_refused_with_the_holder_and_the_way_out(state_dir: Path) -> None:
    with st.run_lock("default"):
        with pytest.raises(st.ClusterBusy) as e, st.run_lock("default"):
            pass
        assert f"pid {os.getpid()}" in str(e.value) and "--cluster-name" in str(e.value)
        with st.run_lock("other"):  # another cluster is another lock
            pass
    with st.run_lock("default"):  # released when the first run is over
        pass


def test_the_lock_is_held_across_processes(state_dir: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from isrlab.harness.cluster import state as st\n"
        "st.STATE_DIR = Path(sys.argv[1])\n"
        "with st.run_lock('default'):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(st.ClusterBusy, match=f"pid {p.pid}"), st.run_lock("default"):
            pass
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(10)
    with st.run_lock("default"):  # the holder exited: free again
        pass


def test_embedded_cluster_refuses_before_touching_anything(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touched: list[str] = []
    monkeypatch.setattr(embedded, "up", lambda *a, **k: touched.append("up"))
    monkeypatch.setattr(embedded, "down", lambda *a, **k: touched.append("down"))
    with (
        st.run_lock("default"),
        pytest.raises(ClusterError, match="in use by another"),
        embedded.embedded_cluster(3, "default"),
    ):
        pass
    assert touched == []  # neither brought up nor torn down: it is the other run's
