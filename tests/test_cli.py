"""The ``shmload`` command as a new user meets it: mistakes are one line on stderr with
the fix and exit status 2, tracebacks only with ``--debug`` or ``SHMLOAD_DEBUG=1``, and
every option's help says what it does and its default.

Most tests call ``shmload.tools.cli.main([...])`` (the console script's entry); a few run the
installed ``shmload`` script and ``python -m shmload`` in a child process.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from shmload.profiler.stats import LoaderStats, MainStats, WorkerStats
from shmload.tools.cli import build_parser, contention_warning, describe_exception, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "shmload")

BROKEN = '''
class Broken:
    """Every sample raises, as a dataset with a bug would."""
    def __len__(self):
        return 32
    def __getitem__(self, i):
        raise ValueError(f"sample {i} is broken")

def make():
    return Broken()

def fails():
    raise ValueError("no data here")

def needs(root):
    return Broken()
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A .py file of the user's with a broken dataset and a failing factory; the path and
    module entries the command adds for it are undone afterwards."""
    path = tmp_path / "userdata_cli.py"
    path.write_text(BROKEN)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield str(path)
    sys.modules.pop("userdata_cli", None)


def one_error_line(capsys, status: int, argv: list[str]) -> str:
    """Run ``shmload argv``: it must return ``status`` and print one line on stderr, no traceback."""
    assert main(argv) == status
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


def image_folder(root) -> str:
    from PIL import Image

    os.makedirs(root / "cat")
    Image.new("RGB", (8, 8), (200, 10, 10)).save(root / "cat" / "a.jpg")
    return str(root)


# ---------------------------------------------------------------- mistakes, one line each
@pytest.mark.pure
def test_pack_into_an_existing_folder_names_it_and_the_fix(tmp_path, capsys):
    out = tmp_path / "out.records"
    out.mkdir()
    line = one_error_line(capsys, 2, ["pack", image_folder(tmp_path / "images"), str(out)])
    assert re.fullmatch(r"shmload pack: '.*out\.records' exists already; .*remove it or give another OUT_DIR", line)


@pytest.mark.pure
def test_pack_of_a_missing_source_folder_names_it_and_the_layout(tmp_path, capsys):
    line = one_error_line(capsys, 2, ["pack", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    assert re.fullmatch(r"shmload pack: the image folder '.*nowhere' does not exist; give the folder that holds "
                        r"one subfolder per class", line)
    assert not (tmp_path / "out").exists()


@pytest.mark.pure
def test_pack_of_a_folder_without_class_folders_says_the_layout(tmp_path, capsys):
    line = one_error_line(capsys, 2, ["pack", str(tmp_path), str(tmp_path / "out")])
    assert re.fullmatch(r"shmload pack: no class folders in '.*'; expected the layout root/<class>/<image>", line)


@pytest.mark.pure
def test_profile_of_a_module_that_does_not_exist_says_where_it_looked(capsys):
    line = one_error_line(capsys, 2, ["profile", "nosuch_module_xyz:thing"])
    assert re.fullmatch(r"shmload profile: no module named 'nosuch_module_xyz' in .* or the installed packages; "
                        r"check the name, .*give its path \(\./mydata\.py\)", line)


@pytest.mark.pure
def test_profile_of_a_missing_attribute_suggests_the_close_name(capsys):
    line = one_error_line(capsys, 2, ["profile", "tests.helpers:small_datset"])
    assert re.fullmatch(r"shmload profile: module 'tests\.helpers' has no attribute 'small_datset'; "
                        r"did you mean 'small_dataset'\?", line)


@pytest.mark.pure
def test_profile_of_a_missing_python_file_names_the_path(tmp_path, capsys):
    line = one_error_line(capsys, 2, ["profile", f"{tmp_path}/absent.py:make"])
    assert re.fullmatch(r"shmload profile: no Python file at .*absent\.py; give the path of a \.py file, "
                        r"or a module name", line)


@pytest.mark.pure
def test_profile_of_a_file_python_cannot_load_says_so(tmp_path, capsys):
    (tmp_path / "data.txt").write_text("def make(): return [1, 2, 3]\n")
    line = one_error_line(capsys, 2, ["profile", f"{tmp_path}/data.txt:make"])
    assert re.fullmatch(r"shmload profile: .*data\.txt is not a Python file; give the path of a \.py file, "
                        r"or a module name", line)
    assert "data" not in sys.modules  # (nothing left behind under the file's name)


@pytest.mark.pure
def test_a_factory_that_raises_is_named_with_its_exception(user_module, capsys):
    line = one_error_line(capsys, 2, ["profile", f"{user_module}:fails"])
    assert re.fullmatch(r"shmload profile: .*userdata_cli\.py:fails raised ValueError: no data here; "
                        r"run with --debug for the traceback", line)


@pytest.mark.pure
def test_a_factory_that_needs_arguments_is_explained(user_module, capsys):
    line = one_error_line(capsys, 2, ["profile", f"{user_module}:needs"])
    assert re.fullmatch(r"shmload profile: .*:needs needs arguments, but FACTORY is called with none: .*", line)


@pytest.mark.pure
def test_a_module_that_fails_to_import_is_named_with_its_exception(tmp_path, monkeypatch, capsys):
    (tmp_path / "userdata_typo.py").write_text("import numpy as np\nx = np.nosuch\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    line = one_error_line(capsys, 2, ["profile", f"{tmp_path}/userdata_typo.py:make"])
    assert re.fullmatch(r"shmload profile: importing .*userdata_typo\.py raised AttributeError: .*nosuch.*; "
                        r"run with --debug for the traceback", line)
    assert "userdata_typo" not in sys.modules


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_dataset_whose_getitem_raises_is_one_line_with_what_failed(user_module, capsys, workers):
    line = one_error_line(capsys, 2, ["profile", f"{user_module}:make", "--workers", workers, "--batches", "2",
                                      "--batch-size", "4", "--quiet", "--start-method", "fork"])
    where = (r"ValueError" if workers == "0" else
             r"ValueError in worker process 0 while loading batch \d+ \(dataset indices \[[\d, ]+\]\)")
    assert re.fullmatch(rf"shmload profile: loading .*userdata_cli\.py:make with num_workers={workers} raised "
                        rf"{where}: sample \d+ is broken; run with --debug for the traceback", line)


@pytest.mark.pure
@pytest.mark.parametrize("argv, message", [
    (["profile", "tests.helpers:small_dataset", "--workers", "1,x"],
     r"argument --workers: expected worker counts 0 or more separated by commas, like 1,2,4, got '1,x'"),
    (["profile", "tests.helpers:small_dataset", "--workers", "-1"],
     r"argument --workers: expected worker counts 0 or more .*got '-1'"),
    (["profile", "tests.helpers:small_dataset", "--batch-size", "0"],
     r"argument --batch-size: expected samples per batch: a whole number of at least 1, got '0'"),
    (["profile", "tests.helpers:small_dataset", "--batches", "ten"],
     r"argument --batches: expected batches per run: a whole number of at least 1, got 'ten'"),
    (["profile", "tests.helpers:small_dataset", "--step-ms", "-5"],
     r"argument --step-ms: expected milliseconds, 0 or more, got '-5'"),
    (["profile", "tests.helpers:small_dataset", "--step-ms", "inf"],
     r"argument --step-ms: expected milliseconds, 0 or more, got 'inf'"),
    (["profile", "tests.helpers"], r"argument MODULE:FACTORY: expected MODULE:FACTORY \(e\.g\. .*got 'tests\.helpers'"),
    (["demo", "--batch-size", "0"], r"argument --batch-size: expected images per batch: .*got '0'"),
    (["pack", "a", "b", "--part-size", "3X"], r"argument --part-size: expected a size like 256M, 64MiB or 1G"),
])
def test_a_bad_argument_is_one_line_pointing_to_help(capsys, argv, message):
    line = one_error_line(capsys, 2, argv)
    command = f"shmload {argv[0]}"
    assert re.fullmatch(rf"{command}: {message}.*; see '{command} --help'", line)


@pytest.mark.pure
def test_no_command_is_one_line_pointing_to_help(capsys):
    line = one_error_line(capsys, 2, [])
    assert re.fullmatch(r"shmload: the following arguments are required: COMMAND; see 'shmload --help'", line)


@pytest.mark.pure
def test_profile_refuses_a_plot_into_a_missing_folder_before_loading(tmp_path, capsys):
    line = one_error_line(capsys, 2, ["profile", "tests.helpers:small_dataset", "--plot", f"{tmp_path}/no/p.png"])
    assert re.fullmatch(r"shmload profile: --plot .*p\.png: the folder .*no does not exist; create it or choose "
                        r"another", line)


# ---------------------------------------------------------------- --debug and SHMLOAD_DEBUG
@pytest.mark.pure
def test_debug_prints_the_users_traceback_before_the_line(user_module, capsys):
    assert main(["--debug", "profile", f"{user_module}:fails"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert re.search(r'userdata_cli\.py", line \d+, in fails\n.*\nValueError: no data here', err)
    assert re.search(r"\nshmload profile: .*:fails raised ValueError: no data here\n\Z", err)  # no --debug hint


@pytest.mark.pure
def test_shmload_debug_in_the_environment_does_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHMLOAD_DEBUG", "1")
    assert main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and "shmload.errors.CommandError: the image folder" in err
    assert err.splitlines()[-1].startswith("shmload pack: the image folder")


@pytest.mark.pure
@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_shmload_debug_set_to_a_no_does_not_print_the_traceback(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("SHMLOAD_DEBUG", value)
    assert main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "SHMLOAD_DEBUG": "", **env})


@pytest.mark.timeout(120)
def test_the_installed_script_reports_a_mistake_in_one_line_and_status_2():
    result = run([SCRIPT, "profile", "nosuch_module_xyz:thing"])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert re.fullmatch(r"shmload profile: no module named 'nosuch_module_xyz' .*\n", result.stderr)
    result = run([sys.executable, "-m", "shmload", "profile", "tests.helpers:small_dataset", "--workers", "1,x"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("shmload profile: argument --workers: expected worker counts")


@pytest.mark.timeout(120)
def test_the_installed_script_shows_the_traceback_with_debug_or_the_variable(user_module):
    for command, env in (([SCRIPT, "--debug"], {}), ([sys.executable, "-m", "shmload"], {"SHMLOAD_DEBUG": "1"})):
        result = run(command + ["profile", f"{user_module}:fails"], **env)
        assert result.returncode == 2, result.stderr
        assert "Traceback (most recent call last):" in result.stderr and "in fails" in result.stderr
        assert result.stderr.splitlines()[-1].endswith(":fails raised ValueError: no data here")


# ---------------------------------------------------------------- help in user words
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.pure
def test_every_option_of_every_command_has_help_with_its_default():
    parser = build_parser()
    commands = _subparsers(parser)
    assert sorted(commands) == ["demo", "pack", "profile"]
    for name, sub in commands.items():
        assert "``" not in (sub.description or "") and ":class:" not in (sub.description or ""), name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and len(action.help) > 15, (name, action.dest)
            if action.option_strings and action.default not in (None, False):
                assert re.search(r"\(default: [^)]+\)", action.help), (name, action.dest, action.help)


@pytest.mark.pure
@pytest.mark.parametrize("command", ["profile", "demo", "pack"])
def test_each_commands_help_tells_how_to_get_a_traceback(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"run 'shmload --debug\s+{command} \.\.\.'\s+or\s+set\s+SHMLOAD_DEBUG=1", out), out
    assert re.search(r"exits\s+with\s+status\s+2", out)


@pytest.mark.pure
def test_profile_help_describes_the_options_in_user_words(capsys):
    assert main(["profile", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Find out whether loading keeps up with training" in out
    assert "--batch-size N samples per batch (default: 64)" in out
    assert re.search(r"--start-method \{fork,spawn,forkserver\} how worker processes start: .*\(default: fork "
                     r"on Linux\)", out)
    assert "--step-ms MS milliseconds of simulated training per batch" in out
    assert "MB/s (10**6 bytes a second)" in out


@pytest.mark.pure
def test_top_level_help_names_the_commands_and_debug(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--debug on an error, print the full Python traceback .*SHMLOAD_DEBUG=1", out)
    assert all(f" {c} " in out for c in ("demo", "profile", "pack"))


# ---------------------------------------------------------------- pure parts
def _run(num_workers: int, others: float | None, cores: int = 2, duration: float = 2.0) -> LoaderStats:
    """A run whose processes used 1 core on average and other programs ``others`` cores."""
    own = 1.0 * duration
    main_stats = MainStats(1, 100, 10**6, 1.0, 1.0, cpu=own / 2)
    workers = tuple(WorkerStats(i, 100 + i, 50, 200, 0, 0.0, 0.5, 0.1, 0.0, cpu=own / 2 / max(1, num_workers))
                    for i in range(max(1, num_workers)))
    machine = None if others is None else own + others * duration
    return LoaderStats(duration, num_workers, cores, 2, main_stats, workers, None, machine_cpu=machine)


@pytest.mark.pure
def test_contention_during_the_runs_flags_the_recommendation():
    text = contention_warning({0: _run(0, 0.05), 1: _run(1, 0.9), 2: _run(2, 0.4)})
    assert text == ("other programs used up to 0.90 of the 2 usable cores during the runs (num_workers=1, 2): "
                    "the recommendation may be too low; run again on a quiet machine")


@pytest.mark.pure
def test_a_quiet_machine_or_an_unknown_load_flags_nothing():
    assert contention_warning({1: _run(1, 0.1), 2: _run(2, 0.15)}) is None  # under 0.2 of a core
    assert contention_warning({1: _run(1, None), 2: _run(2, None)}) is None
    # 8 cores: what others took still leaves the main process and 2 workers their 3
    assert contention_warning({2: _run(2, 3.0, cores=8)}) is None


@pytest.mark.pure
def test_a_worker_error_is_described_by_where_and_its_own_message():
    remote = ValueError('Caught ValueError in DataLoader worker process 1 while loading batch 7 (dataset indices '
                        '[1, 2]).\nOriginal Traceback (most recent call last):\n  File "x.py", line 3, in get\n'
                        '    raise ValueError("bad\\nmore")\nValueError: bad\nmore\n')
    assert describe_exception(remote) == ("ValueError in worker process 1 while loading batch 7 (dataset indices "
                                          "[1, 2]): bad")
    assert describe_exception(KeyError("k")) == "KeyError: 'k'"
    assert describe_exception(RuntimeError()) == "RuntimeError"


# ---------------------------------------------------------------- a real run
@pytest.mark.timeout(60)
def test_profile_prints_decimal_units_the_cores_load_and_no_image_advice_for_arrays(capsys):
    assert main(["profile", "tests.helpers:small_dataset", "--workers", "0,1", "--batches", "4", "--batch-size", "4",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"workers\s+batches/s\s+MB/s\s+stall .* total PSS\s+others\n.*ms/batch\s+cores\n", out)
    rows = re.findall(r"^\s+([01])\s+[\d.]+\s+[\d.]+\s+\d+%.*\s(\d+\.\d (?:kB|MB|GB))\s+(\d\.\d\d|-)$", out, re.M)
    assert [r[0] for r in rows] == ["0", "1"], out
    assert re.search(r"batches/s, \d+\.\d+ (?:B|kB|MB|GB)/s\), num_workers=[01]", out)
    assert re.search(r"^cores: the \d+ usable cores were \d+% busy: this loader \d+\.\d\d cores, other programs "
                     r"\d+\.\d\d$", out, re.M)
    assert not re.search(r"\b(?:KiB|MiB|GiB)\b", out)
    assert "JPEG" not in out and "decod" not in out
