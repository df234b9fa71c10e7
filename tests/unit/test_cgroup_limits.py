"""What this process's cgroup and affinity allow (platforms/cgroup.py), read from fake cgroup v2,
v1 and hybrid trees under tmp_path: CPU quota (none, fractional, below / above the affinity mask,
on an ancestor), memory headroom (none, "max", a real limit, the v1 sentinel, reclaimable cache),
malformed files (no limit known, logged at debug, never an exception), where the cgroup is found
(mountinfo, usual paths, private namespace); then the platform's use of it (kernel threads split by
ranks, device count, host memory) and the real host's values."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from paddle_llm_engine import EngineConfig, LLMEngine
from paddle_llm_engine.platforms import CpuPlatform, Device, cgroup, host_available_memory, host_memory_report

MiB = 2**20
V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
OTHER_MOUNTS = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"


def write(root: Path, files: dict[str, str]) -> Path:
    """Files (path as the process sees it -> text) under the fake root `root`."""
    for name, text in files.items():
        p = root / name.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def v2_tree(root: Path, files: dict[str, str], own: str = "/", mountinfo: str | None = None) -> Path:
    """A cgroup v2 host: this process in cgroup `own`, `files` relative to /sys/fs/cgroup."""
    write(root, {"/proc/self/cgroup": f"0::{own}\n",
                 "/proc/self/mountinfo": OTHER_MOUNTS + V2_MOUNT if mountinfo is None else mountinfo})
    (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
    return write(root, {f"/sys/fs/cgroup/{k}": v for k, v in files.items()})


V1_MOUNTS = OTHER_MOUNTS + (
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime shared:10 - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:13 - cgroup2 cgroup2 rw\n")


def v1_tree(root: Path, files: dict[str, str], own: str = "/kubepods/pod1/c1", mountinfo: str = V1_MOUNTS) -> Path:
    """A cgroup v1 host (hybrid: an empty v2 hierarchy too), this process in `own` in every hierarchy;
    `files` relative to /sys/fs/cgroup."""
    write(root, {"/proc/self/cgroup": f"5:memory:{own}\n4:cpuset:/\n3:cpu,cpuacct:{own}\n1:name=systemd:/\n0::/\n",
                 "/proc/self/mountinfo": mountinfo})
    for d in ("cpu,cpuacct", "memory", "unified"):
        (root / "sys/fs/cgroup" / d / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return write(root, {f"/sys/fs/cgroup/{k}": v for k, v in files.items()})


# -- CPUs ------------------------------------------------------------------------------------------
def test_v2_no_quota_is_the_affinity_mask(tmp_path):
    root = v2_tree(tmp_path, {"cpu.max": "max 100000\n"})
    assert cgroup.cpu_quota(root) is None
    assert cgroup.usable_cpus(root, affinity=4, cpu_count=8) == (
        4, "4 of 8 CPUs: CPU affinity allows 4 (no cgroup CPU quota)")
    assert cgroup.usable_cpus(root, affinity=8, cpu_count=8)[0] == 8


@pytest.mark.parametrize("text, cpus", [("150000 100000", 2), ("50000 100000", 1), ("1000 100000", 1),
                                        ("200000 100000", 2), ("250000 50000", 5), ("150000", 2)])
def test_v2_quota_rounds_up(tmp_path, text, cpus):
    """A fractional quota is rounded up (1.5 -> 2), at least 1; without a period the kernel's 100 ms."""
    n, source = cgroup.usable_cpus(v2_tree(tmp_path, {"cpu.max": text + "\n"}), affinity=8, cpu_count=8)
    assert n == cpus
    assert source.startswith(f"{cpus} of 8 CPUs: cgroup cpu.max quota ")


def test_quota_below_affinity_is_named(tmp_path):
    root = v2_tree(tmp_path, {"cpu.max": "200000 100000\n"})
    n, source = cgroup.usable_cpus(root, affinity=4, cpu_count=8)
    assert (n, source) == (2, "2 of 8 CPUs: cgroup cpu.max quota 200000/100000 = 2.00 CPUs (CPU affinity allows 4)")
    n, source = cgroup.usable_cpus(v2_tree(tmp_path / "b", {"cpu.max": "150000 100000\n"}), affinity=8, cpu_count=8)
    assert (n, source) == (2, "2 of 8 CPUs: cgroup cpu.max quota 150000/100000 = 1.50 CPUs, rounded up "
                              "(CPU affinity allows 8)")


def test_affinity_below_quota_is_named(tmp_path):
    root = v2_tree(tmp_path, {"cpu.max": "400000 100000\n"})
    assert cgroup.usable_cpus(root, affinity=2, cpu_count=8) == (
        2, "2 of 8 CPUs: CPU affinity allows 2 (cgroup cpu.max quota 400000/100000 = 4.00 CPUs)")


def test_tightest_quota_of_the_ancestors_wins(tmp_path):
    """Without a cgroup namespace the process sees the whole tree: a pod's quota binds its containers."""
    own = "/kubepods.slice/pod1.slice/cri-c1.scope"
    root = v2_tree(tmp_path, {"kubepods.slice/cpu.max": "max 100000", "kubepods.slice/pod1.slice/cpu.max": "100000 100000",
                              own.lstrip("/") + "/cpu.max": "300000 100000"}, own=own)
    dirs = cgroup.cgroup_dirs("cpu", root)[1]
    assert [d.relative_to(root / "sys/fs/cgroup").as_posix() for d in dirs] == [
        "kubepods.slice/pod1.slice/cri-c1.scope", "kubepods.slice/pod1.slice", "kubepods.slice", "."]
    assert cgroup.cpu_quota(root) == (100000, 100000, "cpu.max")
    assert cgroup.usable_cpus(root, affinity=8, cpu_count=8)[0] == 1


def test_v1_quota_and_unlimited(tmp_path):
    own = "/kubepods/pod1/c1"
    root = v1_tree(tmp_path, {f"cpu,cpuacct{own}/cpu.cfs_quota_us": "150000\n",
                              f"cpu,cpuacct{own}/cpu.cfs_period_us": "100000\n"})
    assert cgroup.cgroup_dirs("cpu", root)[0] == "v1"
    assert cgroup.usable_cpus(root, affinity=4, cpu_count=8) == (
        2, "2 of 8 CPUs: cgroup cpu.cfs_quota_us/cpu.cfs_period_us quota 150000/100000 = 1.50 CPUs, rounded up "
           "(CPU affinity allows 4)")
    root = v1_tree(tmp_path / "b", {f"cpu,cpuacct{own}/cpu.cfs_quota_us": "-1\n",
                                    f"cpu,cpuacct{own}/cpu.cfs_period_us": "100000\n"})
    assert cgroup.cpu_quota(root) is None
    assert cgroup.usable_cpus(root, affinity=3, cpu_count=8)[0] == 3


@pytest.mark.parametrize("text", ["garbage", "", "100000 0", "0 100000", "-5 100000", "max 100000 extra",
                                  "1.5 100000", "150000 abc"])
def test_malformed_cpu_max_is_no_quota_and_logged(tmp_path, caplog, text):
    root = v2_tree(tmp_path, {"cpu.max": text})
    with caplog.at_level(logging.DEBUG, logger="paddle_llm_engine.platforms.cgroup"):
        assert cgroup.usable_cpus(root, affinity=4, cpu_count=8) == (
            4, "4 of 8 CPUs: CPU affinity allows 4 (no cgroup CPU quota)")
    assert any("cpu.max" in r.getMessage() or "CPU quota" in r.getMessage() for r in caplog.records), caplog.text


def test_malformed_v1_period_is_no_quota(tmp_path, caplog):
    own = "/kubepods/pod1/c1"
    root = v1_tree(tmp_path, {f"cpu,cpuacct{own}/cpu.cfs_quota_us": "150000\n",
                              f"cpu,cpuacct{own}/cpu.cfs_period_us": "soon\n"})
    with caplog.at_level(logging.DEBUG, logger="paddle_llm_engine.platforms.cgroup"):
        assert cgroup.cpu_quota(root) is None
    assert "cpu.cfs_period_us" in caplog.text


def test_unreadable_or_missing_proc_files_mean_no_limit(tmp_path):
    """No /proc/self/cgroup (or not Linux): the affinity mask or os.cpu_count(), no exception."""
    assert cgroup.cgroup_dirs("cpu", tmp_path) == ("", [])
    assert cgroup.usable_cpus(tmp_path, affinity=3, cpu_count=8)[0] == 3
    assert cgroup.memory_headroom(tmp_path) == (None, "no memory cgroup found")
    write(tmp_path, {"/proc/self/cgroup": "not a cgroup line\n\n0::/\n"})  # no mountinfo, no /sys/fs/cgroup
    assert cgroup.usable_cpus(tmp_path, affinity=3, cpu_count=8)[0] == 3
    assert cgroup.memory_headroom(tmp_path)[0] is None


def test_no_affinity_mask_falls_back_to_cpu_count(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    root = v2_tree(tmp_path, {"cpu.max": "max 100000"})
    assert cgroup.usable_cpus(root, cpu_count=6) == (6, "6 of 6 CPUs: os.cpu_count(), no affinity mask "
                                                         "(no cgroup CPU quota)")
    root = v2_tree(tmp_path / "b", {"cpu.max": "300000 100000"})
    assert cgroup.usable_cpus(root, cpu_count=6)[0] == 3


# -- where the cgroup is ---------------------------------------------------------------------------
def test_private_namespace_reads_the_mount_point(tmp_path):
    """A path not visible under the mount (a private cgroup namespace that still names the host's
    path, or one outside the namespace with ..) reads /sys/fs/cgroup itself, never above it."""
    root = v2_tree(tmp_path, {"cpu.max": "100000 100000", "memory.max": "1073741824", "memory.current": "0"},
                   own="/kubepods/burstable/pod1/c1")
    assert cgroup.cgroup_dirs("cpu", root) == ("v2", [root / "sys/fs/cgroup"])
    assert cgroup.usable_cpus(root, affinity=4, cpu_count=4)[0] == 1
    assert cgroup.memory_headroom(root)[0] == 1024 * MiB
    write(tmp_path, {"/proc/self/cgroup": "0::/../../etc\n"})
    assert cgroup.cgroup_dirs("memory", root) == ("v2", [root / "sys/fs/cgroup"])


def test_usual_paths_without_mountinfo(tmp_path):
    own = "/kubepods/pod1/c1"
    root = v1_tree(tmp_path, {f"cpu,cpuacct{own}/cpu.cfs_quota_us": "100000", f"cpu,cpuacct{own}/cpu.cfs_period_us":
                              "100000", f"memory{own}/memory.limit_in_bytes": str(512 * MiB),
                              f"memory{own}/memory.usage_in_bytes": str(12 * MiB)}, mountinfo="")
    assert cgroup.usable_cpus(root, affinity=4, cpu_count=4)[0] == 1
    assert cgroup.memory_headroom(root)[0] == 500 * MiB
    v2 = v2_tree(tmp_path / "b", {"cpu.max": "200000 100000"}, mountinfo="")
    assert cgroup.usable_cpus(v2, affinity=4, cpu_count=4)[0] == 2


def test_mountinfo_mount_point_and_root(tmp_path):
    """The mount point is taken from mountinfo (here not /sys/fs/cgroup, with an escaped space); a
    v1 mount of the container's own cgroup (root /docker/abc) is read at its mount point."""
    mountinfo = OTHER_MOUNTS + "30 23 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"
    write(tmp_path, {"/proc/self/cgroup": "0::/c1\n", "/proc/self/mountinfo": mountinfo,
                     "/mnt/cg two/c1/cpu.max": "300000 100000"})
    assert cgroup.usable_cpus(tmp_path, affinity=8, cpu_count=8)[0] == 3
    b = tmp_path / "b"
    mountinfo = OTHER_MOUNTS + "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    write(b, {"/proc/self/cgroup": "5:memory:/docker/abc\n", "/proc/self/mountinfo": mountinfo,
              "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(256 * MiB),
              "/sys/fs/cgroup/memory/memory.usage_in_bytes": str(56 * MiB)})
    assert cgroup.cgroup_dirs("memory", b) == ("v1", [b / "sys/fs/cgroup/memory"])
    assert cgroup.memory_headroom(b)[0] == 200 * MiB


def test_hybrid_reads_v1_controllers_not_the_empty_v2_hierarchy(tmp_path):
    own = "/kubepods/pod1/c1"
    root = v1_tree(tmp_path, {f"memory{own}/memory.limit_in_bytes": str(100 * MiB),
                              f"memory{own}/memory.usage_in_bytes": str(40 * MiB),
                              "unified/memory.max": "1", "unified/memory.current": "0"})
    assert cgroup.cgroup_dirs("memory", root)[0] == "v1"
    assert cgroup.memory_headroom(root)[0] == 60 * MiB


# -- memory ----------------------------------------------------------------------------------------
def test_v2_memory_max_is_no_limit(tmp_path):
    root = v2_tree(tmp_path, {"memory.max": "max\n", "memory.current": "123456\n"})
    assert cgroup.memory_headroom(root) == (None, "no cgroup v2 memory limit")


def test_v2_memory_limit_headroom_is_max_minus_current(tmp_path):
    root = v2_tree(tmp_path, {"memory.max": f"{1024 * MiB}\n", "memory.current": f"{300 * MiB}\n"})
    headroom, how = cgroup.memory_headroom(root)
    assert headroom == 724 * MiB
    assert how.startswith("cgroup memory.max 1024 MiB minus 300 MiB in use")


def test_inactive_file_cache_counts_as_reclaimable(tmp_path):
    """The weights just read sit in the page cache charged to the cgroup; the kernel reclaims the
    inactive part before an OOM kill, as MemAvailable counts it: it is headroom."""
    stat = "anon 209715200\nfile 104857600\nactive_file 20971520\ninactive_file 83886080\n"
    root = v2_tree(tmp_path, {"memory.max": str(1024 * MiB), "memory.current": str(300 * MiB), "memory.stat": stat})
    assert cgroup.memory_headroom(root)[0] == (1024 - 300 + 80) * MiB


def test_usage_above_limit_is_zero_headroom(tmp_path):
    root = v2_tree(tmp_path, {"memory.max": str(100 * MiB), "memory.current": str(101 * MiB)})
    assert cgroup.memory_headroom(root)[0] == 0


def test_tightest_memory_headroom_of_the_ancestors(tmp_path):
    own = "/kubepods.slice/pod1.slice/c1.scope"
    root = v2_tree(tmp_path, {"kubepods.slice/pod1.slice/memory.max": str(600 * MiB),
                              "kubepods.slice/pod1.slice/memory.current": str(500 * MiB),
                              own.lstrip("/") + "/memory.max": str(1024 * MiB),
                              own.lstrip("/") + "/memory.current": str(400 * MiB)}, own=own)
    assert cgroup.memory_headroom(root)[0] == 100 * MiB


def test_v1_unlimited_sentinel_and_real_limit(tmp_path):
    own = "/kubepods/pod1/c1"
    root = v1_tree(tmp_path, {f"memory{own}/memory.limit_in_bytes": "9223372036854771712\n",
                              f"memory{own}/memory.usage_in_bytes": "3301376\n",
                              "memory/memory.limit_in_bytes": str(2**62)})
    assert cgroup.memory_headroom(root) == (None, "no cgroup v1 memory limit")
    stat = "cache 10485760\ninactive_file 1048576\ntotal_inactive_file 4194304\n"
    root = v1_tree(tmp_path / "b", {f"memory{own}/memory.limit_in_bytes": str(512 * MiB),
                                    f"memory{own}/memory.usage_in_bytes": str(100 * MiB),
                                    f"memory{own}/memory.stat": stat})
    headroom, how = cgroup.memory_headroom(root)
    assert headroom == (512 - 100 + 4) * MiB  # total_inactive_file: this cgroup and its children
    assert how.startswith("cgroup memory.limit_in_bytes 512 MiB minus 96 MiB in use")


@pytest.mark.parametrize("files", [{"memory.max": "lots", "memory.current": "0"},
                                   {"memory.max": "1048576"},  # no usage: no headroom figure
                                   {"memory.max": "1048576", "memory.current": "-3"},
                                   {"memory.max": "", "memory.current": "0"}])
def test_malformed_memory_files_are_no_limit_and_logged(tmp_path, caplog, files):
    root = v2_tree(tmp_path, files)
    with caplog.at_level(logging.DEBUG, logger="paddle_llm_engine.platforms.cgroup"):
        assert cgroup.memory_headroom(root) == (None, "no cgroup v2 memory limit")
    assert "memory." in caplog.text


def test_host_memory_is_the_smaller_of_memavailable_and_the_headroom(tmp_path):
    tight = v2_tree(tmp_path, {"memory.max": str(64 * MiB), "memory.current": str(14 * MiB)})
    avail, where = host_memory_report(tight)
    assert avail == 50 * MiB
    assert where.startswith("cgroup memory.max 64 MiB minus 14 MiB in use") and "below the host's MemAvailable" in where
    loose = v2_tree(tmp_path / "b", {"memory.max": str(2**50), "memory.current": "0"})
    avail, where = host_memory_report(loose)
    assert 0 < avail < 2**50 and where.startswith("the host's MemAvailable (below the cgroup memory.max")
    avail, where = host_memory_report(v2_tree(tmp_path / "c", {"memory.max": "max"}))
    assert avail > 0 and where == "the host's MemAvailable"


# -- the platform's use ----------------------------------------------------------------------------
def test_kernel_threads_share_usable_cpus_between_ranks(monkeypatch):
    cpu = CpuPlatform()
    monkeypatch.setattr(cgroup, "usable_cpus", lambda: (5, "5 of 8 CPUs: cgroup cpu.max quota 450000/100000"))
    assert cpu.kernel_threads(0, ranks_on_host=2) == 2
    assert cpu.kernel_threads_report(0, 2) == (2, "5 of 8 CPUs: cgroup cpu.max quota 450000/100000, shared by 2 ranks")
    assert cpu.kernel_threads(0) == 5
    assert cpu.kernel_threads(3, ranks_on_host=2) == 3  # the operator's num_threads wins
    assert cpu.kernel_threads_report(3, 2) == (3, "num_threads")
    monkeypatch.setattr(cgroup, "usable_cpus", lambda: (1, "1 of 8 CPUs: cgroup cpu.max quota 50000/100000"))
    assert cpu.kernel_threads(0, ranks_on_host=2) == 1  # never 0


def test_cpu_device_count_names_its_source(monkeypatch):
    cpu = CpuPlatform()
    monkeypatch.setattr(cgroup, "usable_cpus", lambda: (2, "2 of 8 CPUs: cgroup cpu.max quota 200000/100000"))
    assert cpu.device_count(Device.CPU) == (2, "CPU cores this process may use (2 of 8 CPUs: cgroup cpu.max quota "
                                               "200000/100000)")
    assert cpu.rank_devices(2, Device.CPU) == [Device.CPU, Device.CPU]
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 exceeds the 2 CPU cores this process may use "
                                         r"\(2 of 8 CPUs: cgroup cpu.max quota 200000/100000\)$"):
        cpu.rank_devices(3, Device.CPU)


def test_real_host_values_are_sane():
    n, source = cgroup.usable_cpus()
    assert 1 <= n <= (os.cpu_count() or 1)
    assert source.startswith(f"{n} of {os.cpu_count()} CPUs: ")
    if hasattr(os, "sched_getaffinity"):
        assert n <= len(os.sched_getaffinity(0))
    headroom, how = cgroup.memory_headroom()
    assert headroom is None or headroom >= 0, how
    avail = host_available_memory()
    assert avail is not None and avail > 0
    if headroom is not None:  # read again inside: the usage may have moved a little
        assert avail <= headroom + 64 * MiB
    assert CpuPlatform().kernel_threads(0, 2) == max(1, n // 2)
    assert CpuPlatform().device_count(Device.CPU)[0] == n


def test_worker_logs_where_its_thread_count_comes_from(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.worker.worker"):
        LLMEngine(EngineConfig(model_dir=tiny_model_dir, device="cpu", max_model_len=64, num_kv_blocks=16))
    n, source = cgroup.usable_cpus()
    assert f"cpu: {n} kernel threads (from {source})" in caplog.text
