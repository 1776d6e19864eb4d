"""doctor(): the preflight on this machine, each threshold with a faked measurement, the CLI, and a real
run inside an 8 MiB private /dev/shm where the OS allows it. Also the size parser the CLI uses."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from labutils.machine import probes
from labutils.machine.doctor import CheckResult, DoctorReport, doctor, doctor_main, shm_budget
from labutils.runner import cgroupfs
from labutils.runner.sizes import format_size, parse_size

# The module itself: the package attribute `labutils.machine.doctor` is the doctor() function it re-exports.
doctor_mod = importlib.import_module("labutils.machine.doctor")

MiB = 1024**2
GiB = 1024**3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = "import sys; from labutils.machine.doctor import doctor_main; sys.exit(doctor_main(sys.argv[1:]))"


# ------------------------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "text, expected",
    [
        (0, 0),
        (4096, 4096),
        ("12", 12),
        ("64k", 64 * 1024),
        ("64KiB", 64 * 1024),
        ("512M", 512 * MiB),
        ("8MiB", 8 * MiB),
        ("100MB", 100 * MiB),
        ("1.5G", 3 * GiB // 2),
        (" 2 g ", 2 * GiB),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12X", "1.2.3M", "-1M", -5, None, True, "nan", float("inf")])
def test_parse_size_rejects_bad_input_with_a_clear_message(bad):
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(bad)


def test_format_size():
    assert format_size(8 * MiB) == "8.0 MiB"
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(3 * GiB) == "3.0 GiB"
    assert format_size(MiB - 1) == "1.0 MiB"  # not "1024.0 KiB"


# --------------------------------------------------------------------------------------- whole report


def test_report_on_this_machine_has_no_fail():
    report = doctor(num_workers=1, batch_bytes="1M")
    assert isinstance(report, DoctorReport)
    failed = [str(c) for c in report.checks if c.status == "FAIL"]
    assert report.ok, failed
    names = [c.name for c in report.checks]
    for name in ("python", "torch", "start_method", "main_importable", "shm", "shm_budget", "nofile",
                 "memory", "cpus", "cuda"):
        assert name in names
    assert report.worst in ("OK", "WARN")
    lines = str(report).splitlines()
    assert lines[0].startswith("OK   python ")
    assert all(line[:4].strip() in ("OK", "WARN", "FAIL") for line in lines if not line.startswith((" ", "--")))
    html = report._repr_html_()
    assert "<table>" in html and "shm_budget" in html
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and len(data["checks"]) == len(report.checks)


def test_doctor_does_not_fix_the_start_method():
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    doctor()
    assert multiprocessing.get_start_method(allow_none=True) == before


def test_check_result_rejects_unknown_status():
    with pytest.raises(ValueError):
        CheckResult("x", "BAD", "detail")
    report = DoctorReport([CheckResult("a", "OK", ""), CheckResult("b", "WARN", "", "do x")])
    assert report.ok and report.worst == "WARN" and report["b"].advice == "do x" and "a" in report
    report.checks.append(CheckResult("c", "FAIL", ""))
    assert not report.ok and report.worst == "FAIL"


# ---------------------------------------------------------------------------------------- shm budget


def test_shm_budget_arithmetic_and_thresholds():
    ok = shm_budget(12 * MiB, prefetch_factor=2, num_workers=4, free_shm=GiB)
    assert ok.status == "OK" and ok.data["estimate_bytes"] == 120 * MiB  # 12 MiB x (2 x 4 + 2)
    assert shm_budget("12M", 2, 4, free_shm=150 * MiB).status == "WARN"  # 120 of 150: above half
    assert shm_budget("12M", 2, 4, free_shm=240 * MiB).status == "OK"  # exactly half: not above
    assert shm_budget("12M", 2, 4, free_shm=120 * MiB).status == "WARN"  # exactly all: not exceeding
    assert shm_budget("12M", 2, 4, free_shm=96 * MiB).status == "FAIL"
    fail = shm_budget("12M", 2, 4, free_shm="64M")
    assert fail.status == "FAIL" and "No space left on device" in fail.detail and fail.advice
    assert shm_budget("3M", prefetch_factor=3, num_workers=1, free_shm="8M").status == "FAIL"  # 9M > 8M
    full = shm_budget("1M", 2, 1, free_shm=0)
    assert full.status == "FAIL" and full.data["fraction"] is None
    json.dumps(full.data, allow_nan=False)  # strict JSON: no Infinity
    zero = shm_budget("1G", 2, 0, free_shm="1M")
    assert zero.status == "OK" and zero.data["estimate_bytes"] == 0
    with pytest.raises(ValueError):
        shm_budget("12Q", 2, 1, free_shm=GiB)
    with pytest.raises(ValueError):
        shm_budget("1M", 0, 1, free_shm=GiB)


def test_small_fake_shm_warns(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("/dev/shm checks are Linux-only")
    monkeypatch.setattr(probes, "shm_usage", lambda path=probes.SHM_PATH: (64 * MiB, 60 * MiB))
    report = doctor(num_workers=2, batch_bytes="8M")
    assert report["shm"].status == "WARN" and "64.0 MiB total" in report["shm"].detail
    assert "--shm-size" in report["shm"].advice
    assert report["shm_budget"].status == "WARN"  # 8 MiB x (2 x 2 + 2) = 48 MiB of 60 MiB free
    assert report.ok  # warnings only


def test_shm_budget_thresholds_inside_doctor(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("/dev/shm checks are Linux-only")
    monkeypatch.setattr(probes, "shm_usage", lambda path=probes.SHM_PATH: (64 * MiB, 60 * MiB))
    assert doctor(num_workers=2, batch_bytes="5M")["shm_budget"].status == "OK"  # 5 x 6 = 30 of 60
    assert doctor(num_workers=2, batch_bytes="10M")["shm_budget"].status == "WARN"  # 60 of 60
    report = doctor(num_workers=2, batch_bytes="16M")  # 96 of 60
    assert report["shm_budget"].status == "FAIL" and not report.ok


def test_missing_shm_fails(monkeypatch, capsys):
    if not sys.platform.startswith("linux"):
        pytest.skip("/dev/shm checks are Linux-only")
    monkeypatch.setattr(probes, "shm_usage", lambda path=probes.SHM_PATH: None)
    report = doctor()
    assert report["shm"].status == "FAIL" and not report.ok
    assert doctor_main([]) == 1
    assert "FAIL shm" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- other checks


def test_low_nofile_warns(monkeypatch):
    resource = pytest.importorskip("resource")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    check = doctor()["nofile"]
    assert check.status == "WARN" and "1024" in check.detail and "ulimit -n" in check.advice


def test_more_workers_than_cpus_warns():
    report = doctor(num_workers=10_000)
    assert report["cpus"].status == "WARN" and "num_workers <=" in report["cpus"].advice
    assert doctor(num_workers=1)["cpus"].status == "OK"


def test_notebook_main_warns_for_spawn_but_not_for_fork(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__, as in Jupyter
    spawn = doctor(start_method="spawn")["main_importable"]
    assert spawn.status == "WARN" and ".py module" in spawn.advice
    if "fork" in __import__("multiprocessing").get_all_start_methods():
        assert doctor(start_method="fork")["main_importable"].status == "OK"


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_start_method_check_names_the_default(monkeypatch, method):
    """The default the check names is the one set in this process, not one re-derived by the code's fallback."""
    import multiprocessing

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} does not exist on {sys.platform}")
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        multiprocessing.set_start_method(method, force=True)
        check = doctor()["start_method"]
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert check.status == "OK" and check.data["default"] == method, check


def test_cgroup_memory_parsing(monkeypatch):
    """Read through the mounts (cgroupfs, as the runner reads them), inside a cgroup namespace and with v1."""
    files, mounts = {}, []
    monkeypatch.setattr(cgroupfs, "read_file", files.get)
    monkeypatch.setattr(cgroupfs, "mountinfo", lambda: mounts)
    mounts[:] = [{"root": "/", "mount": "/sys/fs/cgroup", "fstype": "cgroup2", "options": "rw"}]
    files.update({
        "/proc/self/cgroup": "0::/user.slice/job",
        "/sys/fs/cgroup/user.slice/job/cgroup.controllers": "cpu memory pids",
        "/sys/fs/cgroup/user.slice/job/memory.max": "2147483648\n",
        "/sys/fs/cgroup/user.slice/job/memory.current": "1073741824\n",
        "/sys/fs/cgroup/user.slice/job/cpu.max": "150000 100000\n",
    })
    assert probes.cgroup_memory() == (2 * GiB, GiB, "v2") and probes.cgroup_cpus() == 1.5
    files["/sys/fs/cgroup/user.slice/job/memory.max"] = "max"
    assert probes.cgroup_memory() == (None, GiB, "v2")
    # a container's cgroup namespace: the mount's root is the container's own cgroup
    mounts[:] = [{"root": "/user.slice/job", "mount": "/sys/fs/cgroup", "fstype": "cgroup2", "options": "rw"}]
    files.update({"/sys/fs/cgroup/cgroup.controllers": "memory", "/sys/fs/cgroup/memory.max": str(256 * MiB),
                  "/sys/fs/cgroup/memory.current": str(MiB)})
    assert probes.cgroup_memory() == (256 * MiB, MiB, "v2")
    files.clear()
    mounts[:] = [{"root": "/docker/abc", "mount": "/sys/fs/cgroup/memory", "fstype": "cgroup", "options": "rw,memory"}]
    files.update({
        "/proc/self/cgroup": "4:memory:/docker/abc\n0::/",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(512 * MiB),
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": str(100 * MiB),
    })
    assert probes.cgroup_memory() == (512 * MiB, 100 * MiB, "v1")
    check = doctor_mod._check_memory()
    assert check.status == "WARN" and "cgroup v1 limit 512.0 MiB" in check.detail
    files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712"  # v1's "no limit"
    assert probes.cgroup_memory() == (None, 100 * MiB, "v1")


def test_torch_is_described_without_importing_it(tmp_path):
    code = ("import sys; from labutils.machine.doctor import doctor; r = doctor(); "
            "print(r['torch'].status, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    status, imported = out.stdout.split()
    assert status == "OK" and imported == "False"


def test_missing_torch_fails(monkeypatch):
    monkeypatch.setattr(probes, "torch_info",
                        lambda import_torch: probes.TorchInfo(error="No module named 'torch'"))
    report = doctor()
    assert report["torch"].status == "FAIL" and "pip install" in report["torch"].advice and not report.ok


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_json_parses(capsys):
    rc = doctor_main(["--json", "--num-workers", "1", "--batch-bytes", "12M", "--prefetch-factor", "3"])
    data = json.loads(capsys.readouterr().out)
    assert rc == (0 if data["ok"] else 1)
    budget = next(c for c in data["checks"] if c["name"] == "shm_budget")
    assert budget["data"]["estimate_bytes"] == 12 * MiB * (3 * 1 + 2)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-bytes", "12X"], "invalid size '12X'"),
        (["--num-workers", "-1"], "must be at least 0"),
        (["--num-workers", "two"], "expected a whole number"),
        (["--prefetch-factor", "0"], "must be at least 1"),
        (["--start-method", "threads"], "invalid choice"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_cli_bad_option_exits_2_with_a_message(argv, message, capsys):
    assert doctor_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_subprocess_bad_size_has_no_traceback():
    out = subprocess.run([sys.executable, "-c", CLI, "--batch-bytes", "lots"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 2
    assert "invalid size 'lots'" in out.stderr and "Traceback" not in out.stderr


def _private_shm_works() -> str:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "needs Linux with unshare(1)"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o size=8m tmpfs /dev/shm"],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return f"a private mount namespace is not permitted here: {probe.stderr.strip()[:200]}"
    return ""


def test_doctor_inside_an_8mib_private_shm_warns():
    reason = _private_shm_works()
    if reason:
        pytest.skip(reason)
    cmd = (f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {sys.executable} -c \"{CLI}\" "
           "--json --num-workers 2 --batch-bytes 3M")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    data = json.loads(out.stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["shm"]["status"] == "WARN"
    assert checks["shm"]["data"]["total_bytes"] == 8 * MiB
    assert checks["shm_budget"]["status"] == "FAIL"  # 3 MiB x 2 x 2 = 12 MiB > 8 MiB
    assert out.returncode == 1 and data["ok"] is False


# --------------------------------------------------------------------------- RemoveIPC
def _logind(tmp_path, main=None, dropins=()):
    conf = tmp_path / "logind.conf"
    if main is not None:
        conf.write_text(main)
    d = tmp_path / "logind.conf.d"
    d.mkdir()
    for name, text in dropins:
        (d / name).write_text(text)
    return str(conf), [str(d)]


def test_removeipc_warns_for_a_user_by_default(tmp_path):
    from labutils.machine.doctor import _check_removeipc

    conf, dirs = _logind(tmp_path, "[Login]\n#RemoveIPC=yes\n")
    c = _check_removeipc(uid=1000, systemd_running=True, main_conf=conf, dropin_dirs=dirs)
    assert c.status == "WARN" and "default is yes" in c.detail and "enable-linger" in c.advice
    assert c.data["value"] is None and c.data["files"] == [conf]


def test_removeipc_no_in_a_dropin_wins_and_a_later_yes_wins_again(tmp_path):
    from labutils.machine.doctor import _check_removeipc

    conf, dirs = _logind(tmp_path, "[Login]\nRemoveIPC=yes\n", [("50-keep.conf", "[Login]\nRemoveIPC=no\n")])
    assert _check_removeipc(uid=1000, systemd_running=True, main_conf=conf, dropin_dirs=dirs).status == "OK"
    (tmp_path / "logind.conf.d" / "90-site.conf").write_text("[Login]\nRemoveIPC=yes\n")
    c = _check_removeipc(uid=1000, systemd_running=True, main_conf=conf, dropin_dirs=dirs)
    assert c.status == "WARN" and "RemoveIPC=yes" in c.detail
    # a key outside [Login] is not logind's setting
    other = tmp_path / "other"
    other.mkdir()
    conf2, dirs2 = _logind(other, "[Other]\nRemoveIPC=no\n")
    assert _check_removeipc(uid=1000, systemd_running=True, main_conf=conf2, dropin_dirs=dirs2).status == "WARN"


def test_removeipc_does_not_apply_to_root_system_users_or_without_systemd(tmp_path):
    from labutils.machine.doctor import _check_removeipc

    conf, dirs = _logind(tmp_path, "[Login]\nRemoveIPC=yes\n")
    assert _check_removeipc(uid=0, systemd_running=True, main_conf=conf, dropin_dirs=dirs).status == "OK"
    assert _check_removeipc(uid=120, systemd_running=True, main_conf=conf, dropin_dirs=dirs).status == "OK"
    c = _check_removeipc(uid=1000, systemd_running=False, main_conf=conf, dropin_dirs=dirs)
    assert c.status == "OK" and "not running" in c.detail


def test_removeipc_unreadable_config_still_warns(tmp_path):
    import os

    from labutils.machine.doctor import _check_removeipc

    conf, dirs = _logind(tmp_path, "[Login]\nRemoveIPC=no\n")
    os.chmod(conf, 0)
    try:
        if os.access(conf, os.R_OK):
            pytest.skip("running as root: every file is readable")
        c = _check_removeipc(uid=1000, systemd_running=True, main_conf=conf, dropin_dirs=dirs)
        assert c.status == "WARN" and "could not read" in c.detail
    finally:
        os.chmod(conf, 0o644)
