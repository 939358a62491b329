"""Activation without code changes, in real subprocesses: the .pth and CGGUARD_ENABLED, the
sitecustomize folder, the runner's children, and what each costs when idle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
from helpers import clean_environ, patched_count

from cgguard._commands.run import BOOT_DIR

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = str(REPO / "sitecustomize_example")
PATCHED = "import torch, cgguard; s = cgguard.status(); print(len(s.patched), s.activated_by)"


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)


def python(
    code: str, env: dict[str, str], exe: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return run([exe, "-c", textwrap.dedent(code)], env)


def cgguard_run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m cgguard run ARGS`` in an environment without cgguard's variables."""
    return run([sys.executable, "-m", "cgguard", "run", *args], clean_environ())


@pytest.mark.subprocess
def test_enabled_variable_activates_through_the_pth() -> None:
    """CGGUARD_ENABLED=1 alone patches torch when the program imports it, silently."""
    done = python(PATCHED, clean_environ(CGGUARD_ENABLED="1"))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{patched_count()} pth\n", "")


@pytest.mark.subprocess
@pytest.mark.parametrize("value", ["", "0", "off", "no"])
def test_pth_line_is_inert_unless_enabled(value: str) -> None:
    """Unset, empty or false, the .pth line imports nothing of cgguard, even with torch."""
    env = clean_environ() if value == "" else clean_environ(CGGUARD_ENABLED=value)
    done = python("import sys, torch; print('cgguard' in sys.modules)", env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "False\n", "")


@pytest.mark.subprocess
def test_idle_activation_loads_only_the_standard_library() -> None:
    """Activated, with torch never imported: no wrapt, structlog or torch, no typing."""
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    bare = json.loads(python(code, clean_environ()).stdout)
    done = python(code, clean_environ(CGGUARD_ENABLED="1"))
    added = sorted(set(json.loads(done.stdout)) - set(bare))
    assert added == ["cgguard", "cgguard._boot"]
    assert done.stderr == ""


@pytest.mark.subprocess
def test_bad_values_warn_at_start_and_the_program_runs() -> None:
    """A bad CGGUARD_* value is one stderr line at start, torch or not; defaults are used."""
    env = clean_environ(CGGUARD_ENABLED="1", CGGUARD_MODE="rase", CGGUARD_CAPTURE="sometimes")
    done = python("print('ran')", env)
    assert (done.returncode, done.stdout) == (0, "ran\n")
    assert done.stderr == (
        "cgguard: ignoring CGGUARD_MODE='rase': accepted values are raise, log; using log\n"
        "cgguard: ignoring CGGUARD_CAPTURE='sometimes': accepted values are enabled, disabled; "
        "using as it is (enabled at start)\n"
    )


@pytest.mark.subprocess
def test_bad_enabled_value_warns_and_stays_off() -> None:
    """CGGUARD_ENABLED with an unknown spelling warns once and does not activate."""
    done = python(PATCHED, clean_environ(CGGUARD_ENABLED="maybe", PYTHONPATH=EXAMPLE))
    # The sitecustomize folder alone would activate; an unreadable switch leaves that default.
    assert done.stdout == f"{patched_count()} sitecustomize\n"
    assert done.stderr == (
        "cgguard: ignoring CGGUARD_ENABLED='maybe': accepted values are "
        "1/true/yes/on or 0/false/no/off; treated as unset\n"
    )


@pytest.mark.subprocess
def test_unknown_variables_warn_at_start_with_the_closest_name() -> None:
    """Each CGGUARD_* name cgguard does not read is one line at start, naming the closest one."""
    env = clean_environ(
        CGGUARD_ENABLED="1", CGGUARD_MOD="log", CGGUARD_RULE_NESTED="off", CGGUARD_XYZZY="1"
    )
    done = python("print('ran')", env)
    expected = (
        0,
        "ran\n",
        "cgguard: ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?\n"
        "cgguard: ignoring CGGUARD_RULE_NESTED: no such rule; "
        "did you mean CGGUARD_RULE_NESTED_CAPTURE?\n"
        "cgguard: ignoring CGGUARD_XYZZY: no such variable; the variables are CGGUARD_ENABLED, "
        "CGGUARD_MODE, CGGUARD_LOG_FORMAT, CGGUARD_LOG_FILE, CGGUARD_LOG_TARGET, "
        "CGGUARD_LOG_LEVEL, CGGUARD_REPORT, CGGUARD_CAPTURE, CGGUARD_SIMULATE_CUDA, "
        "CGGUARD_VLLM_BRIDGE, CGGUARD_EXEMPT, CGGUARD_EXEMPT_FILE, CGGUARD_WINDOW, "
        "CGGUARD_PROFILES, CGGUARD_INSPECT, CGGUARD_INSPECT_FIRST, CGGUARD_CENSUS, "
        "CGGUARD_CENSUS_REPLAYS, CGGUARD_METRICS, CGGUARD_MANIFEST, CGGUARD_RANK_CHECK, "
        "CGGUARD_RULE_<RULE>\n",
    )
    assert expected == (done.returncode, done.stdout, done.stderr)


@pytest.mark.subprocess
def test_known_variables_cost_no_name_matching() -> None:
    """With every CGGUARD_* name known, start-up loads the parser alone: no difflib, no re."""
    code = "import sys, json; print(json.dumps(sorted(sys.modules)))"
    bare = json.loads(python(code, clean_environ()).stdout)
    env = clean_environ(CGGUARD_ENABLED="1", CGGUARD_MODE="rase", CGGUARD_RULE_NESTED_CAPTURE="off")
    done = python(code, env)
    added = sorted(set(json.loads(done.stdout)) - set(bare))
    expected = (
        [
            "cgguard",
            "cgguard._boot",
            "cgguard._config",
            "cgguard._config.settings",
            "cgguard._errors",
            "cgguard._rules",
            "cgguard._rules.table",
            "cgguard._support",
            "cgguard._support.warn",
        ],
        "cgguard: ignoring CGGUARD_MODE='rase': accepted values are raise, log; using log\n",
    )
    assert expected == (added, done.stderr)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["CGGUARD_ENABLED", "CGGUARD_MODE"])
def test_long_values_are_cut_at_start(name: str) -> None:
    """A value of 10,000 characters prints its first 200 and its length, not a 10,000-long line."""
    env = clean_environ(CGGUARD_ENABLED="1")
    env[name] = "x" * 10_000
    done = python("print('ran')", env)
    accepted = (
        "1/true/yes/on or 0/false/no/off; treated as unset"
        if name == "CGGUARD_ENABLED"
        else "raise, log; using log"
    )
    expected = (
        0,
        "ran\n",
        f"cgguard: ignoring {name}='{'x' * 199}... (10000 characters): "
        f"accepted values are {accepted}\n",
    )
    assert expected == (done.returncode, done.stdout, done.stderr)


@pytest.mark.subprocess
def test_patch_failure_leaves_torch_importable() -> None:
    """If patching fails inside ``import torch``, torch imports, one line says so, all runs."""
    code = """
        import cgguard._core.patches
        def broken(*args):
            raise RuntimeError("injected")
        cgguard._core.patches.patch_torch = broken
        import torch
        print(torch.cuda.graphs.graph.__enter__.__name__)
        """
    done = python(code, clean_environ(CGGUARD_ENABLED="1"))
    assert (done.returncode, done.stdout) == (0, "__enter__\n")
    assert done.stderr == (
        "cgguard: could not patch torch, captures are not guarded: RuntimeError('injected')\n"
    )


@pytest.mark.subprocess
def test_sitecustomize_folder_activates_by_itself() -> None:
    """sitecustomize_example on PYTHONPATH is the opt-in: no variable needed."""
    done = python(PATCHED, clean_environ(PYTHONPATH=EXAMPLE))
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{patched_count()} sitecustomize\n",
        "",
    )


@pytest.mark.subprocess
def test_sitecustomize_folder_respects_enabled_zero() -> None:
    """CGGUARD_ENABLED=0 turns the sitecustomize folder off."""
    done = python(PATCHED, clean_environ(PYTHONPATH=EXAMPLE, CGGUARD_ENABLED="0"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "0 None\n", "")


@pytest.mark.subprocess
def test_users_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    """The bootstrap sitecustomize runs the user's, found next on sys.path, once."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.OWN_SITE = __file__\n")
    env = clean_environ(PYTHONPATH=os.pathsep.join([EXAMPLE, str(own)]))
    done = python(PATCHED + "; import builtins; print(builtins.OWN_SITE)", env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{patched_count()} sitecustomize\n{own / 'sitecustomize.py'}\n"


@pytest.mark.subprocess
def test_a_sitecustomize_copied_from_an_earlier_cgguard_still_activates(tmp_path: Path) -> None:
    """A copy that imports ``activate`` from ``cgguard._startup``, as sitecustomize files copied
    into images before ``cgguard.activate`` did, still guards its processes."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "from cgguard._startup import activate\nactivate('sitecustomize', default=True)\n"
    )
    done = python(PATCHED, clean_environ(PYTHONPATH=str(folder)))
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{patched_count()} sitecustomize\n",
        "",
    )


def test_example_is_the_runners_bootstrap() -> None:
    """sitecustomize_example ships the very file the runner puts on PYTHONPATH."""
    ours = Path(BOOT_DIR, "sitecustomize.py").read_text()
    assert Path(EXAMPLE, "sitecustomize.py").read_text() == ours


@pytest.mark.subprocess
def test_three_activations_patch_once() -> None:
    """The .pth, the sitecustomize folder and an explicit install() leave one wrapper each."""
    code = """
        import cgguard, torch, wrapt, inspect
        cgguard.install()
        s = cgguard.status()
        enter = vars(torch.cuda.graphs.graph)["__enter__"]
        print(len(s.patched), s.activated_by, inspect.isfunction(enter.__wrapped__))
        """
    done = python(code, clean_environ(CGGUARD_ENABLED="1", PYTHONPATH=EXAMPLE))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{patched_count()} pth True\n", "")


CHILDREN = """
    import multiprocessing, subprocess, sys

    def patched(_=None):
        import torch, cgguard
        return len(cgguard.status().patched)

    if __name__ == "__main__":
        child = subprocess.run(
            [sys.executable, "-c", "import torch, cgguard; print(len(cgguard.status().patched))"],
            capture_output=True, text=True, check=True,
        )
        print("subprocess", child.stdout.strip())
        for method in ("spawn", "forkserver"):
            with multiprocessing.get_context(method).Pool(1) as pool:
                print(method, pool.map(patched, [0])[0])
    """


@pytest.mark.subprocess
def test_children_inherit_activation(tmp_path: Path) -> None:
    """Under the runner, subprocess, spawn and forkserver children are patched too."""
    script = tmp_path / "children.py"
    script.write_text(textwrap.dedent(CHILDREN))
    done = cgguard_run(str(script))
    assert (done.returncode, done.stderr) == (0, "")
    n = patched_count()
    assert done.stdout == f"subprocess {n}\nspawn {n}\nforkserver {n}\n"


@pytest.mark.subprocess
def test_other_python_without_cgguard_starts_silently(tmp_path: Path) -> None:
    """A Python without cgguard, given the runner's environment, starts normally and quietly."""
    venv.create(tmp_path / "other", with_pip=False)
    other = str(tmp_path / "other" / "bin" / "python")
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("print('own sitecustomize')\n")
    env = clean_environ(CGGUARD_ENABLED="1", PYTHONPATH=os.pathsep.join([BOOT_DIR, str(own)]))
    done = python("import sys; print('cgguard' in sys.modules)", env, exe=other)
    assert (done.returncode, done.stdout, done.stderr) == (0, "own sitecustomize\nFalse\n", "")


@pytest.mark.subprocess
@pytest.mark.simulated
def test_runner_configuration_reaches_the_program(tmp_path: Path) -> None:
    """--simulate-cuda --capture disabled: a capture is refused, reported as JSON to the file."""
    script = tmp_path / "capture.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    pass
            except RuntimeError as exc:
                print(type(exc).__name__)
            """
        )
    )
    log = tmp_path / "events.jsonl"
    done = cgguard_run(
        "--simulate-cuda", "--capture", "disabled", "--log-file", str(log), str(script)
    )
    assert (done.returncode, done.stdout) == (0, "CaptureDisabledError\n")
    assert done.stderr == (
        "cgguard: CGGUARD_SIMULATE_CUDA: torch.cuda runs on cgguard's simulated CUDA runtime "
        "(no GPU work; results are not GPU results)\n"
    )
    # The violation, the summary, and the census, which counted the refused capture.
    event, summary, census = [json.loads(line) for line in log.read_text().splitlines()]
    assert (census["event"], census["totals"]["outcomes"]["refused"]) == ("cgguard.census", 1)
    assert (summary["event"], summary["totals"]) == ("cgguard.summary", {"capture_disabled": 1})
    assert (event["rule"], event["action"], event["disabled_stack"]) == (
        "capture_disabled",
        "raised",
        None,
    )
    code = "with torch.cuda.graph(torch.cuda.CUDAGraph()):"  # line 4: the text starts with \n
    frame = {"file": str(script), "line": 4, "function": "<module>", "code": code}
    assert event["stack"] == [frame]


@pytest.mark.subprocess
def test_explicit_install_before_torch_keeps_its_configuration() -> None:
    """Under CGGUARD_ENABLED=1, a program's own install(Config) survives ``import torch``."""
    code = """
        import cgguard
        cgguard.install(cgguard.Config(mode="log"))
        import torch
        s = cgguard.status()
        print(s.config.mode, len(s.patched))
        """
    done = python(code, clean_environ(CGGUARD_ENABLED="1"))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"log {patched_count()}\n", "")


def test_the_pth_skips_exactly_the_values_the_settings_read_as_off() -> None:
    """The .pth line's shortcut, which spares an idle process cgguard's import, leaves out
    just the spellings of "off" that CGGUARD_ENABLED's one parser reads, and an empty value."""
    import ast

    from cgguard._config.settings import parse_bool

    line = (REPO / "cgguard.pth").read_text().strip()
    skipped = next(
        node.comparators[0]
        for node in ast.walk(ast.parse(line))
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn)
    )
    assert isinstance(skipped, ast.Tuple)
    words = {ast.literal_eval(item) for item in skipped.elts}
    spellings = {"", "0", "1", "false", "true", "no", "yes", "off", "on", "maybe"}
    assert words == {w for w in spellings if w == "" or parse_bool(w) is False}


@pytest.mark.subprocess
def test_a_misspelt_on_switch_is_one_line_when_torch_is_imported() -> None:
    """CGGUARD_ENABLE=1 (no D) leaves cgguard off; torch's import says so, naming the variable
    meant, and the program runs on."""
    done = python("import torch; print('ran')", clean_environ(CGGUARD_ENABLE="1"))
    expected = (
        "cgguard: CGGUARD_ENABLE (no such variable; did you mean CGGUARD_ENABLED?) is set, and "
        "nothing switched cgguard on before torch was imported: captures are not guarded\n"
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", expected)


@pytest.mark.subprocess
def test_settings_without_an_on_switch_are_one_line_naming_the_switch() -> None:
    """Known variables set, nothing switching cgguard on: one line names them and
    CGGUARD_ENABLED."""
    env = clean_environ(CGGUARD_MODE="log", CGGUARD_RULE_NESTEDCAPTURE="raise")
    done = python("import torch; print('ran')", env)
    expected = (
        "cgguard: CGGUARD_RULE_NESTEDCAPTURE (no such rule; did you mean "
        "CGGUARD_RULE_NESTED_CAPTURE?) is set, and nothing switched cgguard on before torch was "
        "imported: captures are not guarded\n"
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", expected)
    done = python("import torch", clean_environ(CGGUARD_MODE="log", CGGUARD_INSPECT="1"))
    expected = (
        "cgguard: CGGUARD_INSPECT, CGGUARD_MODE are set, but nothing switched cgguard on before "
        "torch was imported (CGGUARD_ENABLED=1 does): captures are not guarded\n"
    )
    assert (done.returncode, done.stderr) == (0, expected)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("code", "changes"),
    [
        # Nothing imports torch: nothing to guard, nothing said.
        ("print('ran')", {"CGGUARD_ENABLE": "1"}),
        # The program switches cgguard on itself, before torch.
        ("import cgguard; cgguard.install(); import torch; print('ran')", {"CGGUARD_MODE": "log"}),
        # Off, said so: the choice is made.
        ("import torch; print('ran')", {"CGGUARD_ENABLED": "0", "CGGUARD_MODE": "log"}),
        # Empty is unset, and no other variable is set: nothing went unheeded.
        ("import torch; print('ran')", {"CGGUARD_ENABLED": ""}),
        # On, with a misspelt setting: the settings' own warning, once.
        ("import torch; print('ran')", {"CGGUARD_ENABLED": "1", "CGGUARD_MOD": "log"}),
    ],
)
def test_the_on_switch_watch_stays_quiet_where_nothing_went_unheeded(
    code: str, changes: dict[str, str]
) -> None:
    """Only a process that imports torch with CGGUARD_* variables set and cgguard off, never
    switched on, hears of it."""
    done = python(code, clean_environ(**changes))
    said = (
        "cgguard: ignoring CGGUARD_MOD: no such variable; did you mean CGGUARD_MODE?\n"
        if "CGGUARD_MOD" in changes
        else ""
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", said)


@pytest.mark.subprocess
def test_a_sitecustomize_activation_is_an_on_switch() -> None:
    """The sitecustomize folder switches cgguard on without CGGUARD_ENABLED: the .pth's watch
    says nothing."""
    env = clean_environ(PYTHONPATH=EXAMPLE, CGGUARD_MODE="log")
    done = python(PATCHED, env)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{patched_count()} sitecustomize\n",
        "",
    )


@pytest.mark.subprocess
def test_pytest_without_cgguard_says_unheeded_variables_in_its_summary(tmp_path: Path) -> None:
    """A test session that imports torch with CGGUARD_ENABLE=1 and no --cgguard says so once,
    at the end where -q still shows it; with --cgguard, only the settings' own warning."""
    (tmp_path / "test_one.py").write_text("import torch\n\ndef test_one():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_one.py"]
    line = (
        "cgguard: CGGUARD_ENABLE (no such variable; did you mean CGGUARD_ENABLED?) is set, and "
        "nothing switched cgguard on (pytest ran without --cgguard): captures are not guarded"
    )
    env = clean_environ(CGGUARD_ENABLE="1")
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout.splitlines().count(line), done.stderr) == (0, 1, "")
    argv.append("--cgguard")
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, "not guarded" in done.stdout + done.stderr) == (0, False)
    assert "cgguard: ignoring CGGUARD_ENABLE: no such variable" in done.stderr
    argv[-1] = "--no-cgguard"  # off by choice, as CGGUARD_ENABLED=0 says
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, "not guarded" in done.stdout + done.stderr) == (0, False)


@pytest.mark.subprocess
@pytest.mark.parametrize(("level", "events"), [("info", ["cgguard.census"]), ("warning", [])])
def test_log_level_keeps_the_census_out_of_a_quiet_process_log(
    level: str, events: list[str]
) -> None:
    """CGGUARD_LOG_LEVEL=warning keeps the exit census (an info event) of a process that broke
    no rule out of its log; at info it is written."""
    code = """
        import torch
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            pass
        print('ran')
        """
    env = clean_environ(CGGUARD_ENABLED="1", CGGUARD_SIMULATE_CUDA="1", CGGUARD_LOG_LEVEL=level)
    done = python(code, env)
    # The simulation says once that it is one, a cgguard line; the rest are events.
    lines = [line for line in done.stderr.splitlines() if not line.startswith("cgguard: ")]
    written = [json.loads(line)["event"] for line in lines]
    assert (done.returncode, done.stdout, written) == (0, "ran\n", events)
