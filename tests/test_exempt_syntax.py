"""cgguard._rules.exempt_syntax: the syntax of exemptions, as Config, CGGUARD_EXEMPT, a file and the
runner take it."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from helpers import DEFAULT_CONFIGURATION, clean_environ

import cgguard
from cgguard._commands.info import _configuration
from cgguard._config import settings as _settings
from cgguard._rules import exempt_syntax as _exempt_syntax

if TYPE_CHECKING:
    from pathlib import Path

SYNTAX = (
    "RULE=PLACE, PLACE a module (torch._inductor.), a file glob with a '/' (*/kernels.py) "
    "or a function (module:qualname)"
)
RULES = (
    "capture_disabled, nested_capture, concurrent_capture, sync_during_capture, abandoned_capture, "
    "implicit_sync, dead_input, stale_binding, rng_during_capture, first_use_in_capture, "
    "rank_divergence"
)


@pytest.mark.parametrize(
    ("place", "kind"),
    [
        ("torch._inductor.", _exempt_syntax.MODULE),
        ("torch._inductor", _exempt_syntax.MODULE),
        ("vllm_plugin", _exempt_syntax.MODULE),
        (
            "torch._inductor.runtime.benchmarking:Benchmarker.benchmark_gpu_with_cuda_graph",
            "function",
        ),
        ("pkg.mod:outer.<locals>.inner", _exempt_syntax.FUNCTION),
        ("*/vllm_plugin/kernels.py", _exempt_syntax.FILE),
        ("/opt/app/kernels.py", _exempt_syntax.FILE),
        ("/opt/app:v2/kernels.py", _exempt_syntax.FILE),  # a '/' makes it a file, ':' or not
    ],
)
def test_each_place_is_one_kind(place: str, kind: str) -> None:
    """The kind of a place follows from its characters alone: '/' a file, ':' a function."""
    assert (kind, None) == (_exempt_syntax.kind(place), _exempt_syntax.problem(place))


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("capture_disabled", "not RULE=PLACE"),
        ("capture_disabled=", "no PLACE after '='"),
        ("nested=torch", f"no rule 'nested'; the rules are {RULES}"),
        ("capture_disabled=benchmarking.py", "a file glob holds a '/': write */benchmarking.py"),
        ("capture_disabled=kernels*", "a file glob holds a '/': write */kernels*"),
        (
            "capture_disabled=torch..x",
            "not a module name, a file glob with a '/' nor module:qualname",
        ),
        (
            "capture_disabled=torch:",
            "a function is module:qualname (vllm_plugin.kernels:Kernel.run)",
        ),
        (
            "capture_disabled=9lives:f",
            "a function is module:qualname (vllm_plugin.kernels:Kernel.run)",
        ),
    ],
)
def test_refused_entries_say_why(entry: str, reason: str) -> None:
    """Each malformed entry is refused with the reason, and the entries around it stand."""
    value = f"nested_capture=a;{entry};sync_during_capture=b"
    expected = ([("nested_capture", "a"), ("sync_during_capture", "b")], [(entry, reason)])
    assert expected == _exempt_syntax.parse(value)


def test_parse_folds_rules_keeps_places_and_drops_repeats() -> None:
    """Rules in any case and spacing; places exactly as written; an entry repeated is one."""
    value = " Capture_Disabled = Torch._Inductor. ;;capture_disabled=Torch._Inductor.; "
    expected = ([("capture_disabled", "Torch._Inductor.")], [])
    assert expected == _exempt_syntax.parse(value)


def test_file_lines_comments_and_line_numbers(tmp_path: Path) -> None:
    """A file: entries a line (or ';'-separated), '#' comments from a line's start or after a
    blank, a '#' inside a glob kept; refused entries come with their line."""
    path = tmp_path / "exemptions"
    path.write_text(
        "# image exemptions\n"
        "capture_disabled=torch._inductor.runtime.benchmarking  # autotuning\n"
        "\n"
        "nested_capture=*/build#2/kernels.py; abandoned_capture=x\n"
        "oops\n"
    )
    expected = (
        [
            ("capture_disabled", "torch._inductor.runtime.benchmarking"),
            ("nested_capture", "*/build#2/kernels.py"),
            ("abandoned_capture", "x"),
        ],
        [(5, "oops", "not RULE=PLACE")],
        None,
    )
    assert expected == _exempt_syntax.parse_file(str(path))


def test_oversized_file_is_refused_whole(tmp_path: Path) -> None:
    """A file longer than an exemptions file can be is not read: nothing of it applies."""
    path = tmp_path / "exemptions"
    path.write_text("capture_disabled=x\n" + "#" * _exempt_syntax.LONGEST_FILE)
    assert (
        [],
        [],
        f"longer than {_exempt_syntax.LONGEST_FILE} bytes",
    ) == _exempt_syntax.parse_file(str(path))


def test_environment_problems_and_values(tmp_path: Path) -> None:
    """read(): the entries that stand, their variables, one problem per refused entry, and one
    per refused line of the file, which is named with the line."""
    path = tmp_path / "exemptions"
    path.write_text("capture_disabled=a\nwhat\n")
    environ = {"CGGUARD_EXEMPT": "x=y;nested_capture=b", "CGGUARD_EXEMPT_FILE": str(path)}
    expected = (
        {"exempt": (("nested_capture", "b"),), "exempt_file": str(path)},
        {"exempt": "CGGUARD_EXEMPT", "exempt_file": "CGGUARD_EXEMPT_FILE"},
        [
            f"ignoring the exemption 'x=y' in CGGUARD_EXEMPT: no rule 'x'; the rules are {RULES}",
            f"ignoring the exemption 'what' in {str(path)!r} line 2: not RULE=PLACE; "
            f"an entry is {SYNTAX}",
        ],
    )
    assert expected == _settings.read(environ)


def test_nothing_valid_in_the_variable_sets_nothing() -> None:
    """A CGGUARD_EXEMPT with no entry that stands leaves exempt at its default."""
    assert cgguard.Config() == cgguard.Config.from_environ({"CGGUARD_EXEMPT": "a;b"}, warn=False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "capture_disabled",
            "Config(exempt='capture_disabled'): not RULE=PLACE; accepted values are None, "
            "RULE=PLACE entries (';' between them in a str), (rule, place) pairs or a mapping "
            "of rule to places, PLACE a module (torch._inductor.), a file glob with a '/' "
            "(*/kernels.py) or a function (module:qualname)",
        ),
        (
            ["nested_capture=x", "capture=y"],
            "Config(exempt=['nested_capture=x', 'capture=y']): entry 'capture=y': no rule "
            f"'capture'; the rules are {RULES}",
        ),
        (
            {"nested_capture": 3},
            "Config(exempt={'nested_capture': 3}): entry ('nested_capture', 3): a rule and a "
            "place are each a str; accepted values are None, RULE=PLACE entries (';' between "
            "them in a str), (rule, place) pairs or a mapping of rule to places, PLACE a module "
            "(torch._inductor.), a file glob with a '/' (*/kernels.py) or a function "
            "(module:qualname)",
        ),
        (
            ("capture_disabled", "x"),
            "Config(exempt=('capture_disabled', 'x')): entry 'capture_disabled': not "
            "RULE=PLACE; accepted values are None, RULE=PLACE entries (';' between them in a "
            "str), (rule, place) pairs or a mapping of rule to places, PLACE a module "
            "(torch._inductor.), a file glob with a '/' (*/kernels.py) or a function "
            "(module:qualname)",
        ),
    ],
)
def test_config_refuses_with_one_line(value: object, message: str) -> None:
    """Config(exempt=bad) is a ConfigError naming the input, the entry and what is accepted."""
    with pytest.raises(cgguard.ConfigError) as refused:
        cgguard.Config(exempt=value)  # type: ignore[arg-type]
    assert message == str(refused.value)


def test_config_as_dict_writes_entries() -> None:
    """A report's config holds exemptions as they are written."""
    config = cgguard.Config(exempt={"capture_disabled": ["a.b:C.f", "*/k.py"]})
    assert config.as_dict()["exempt"] == ["capture_disabled=a.b:C.f", "capture_disabled=*/k.py"]


def test_info_lists_exemptions_and_their_sources(tmp_path: Path) -> None:
    """cgguard info: one line per exemption, from the variable and from the file."""
    path = tmp_path / "exemptions"
    path.write_text("nested_capture=*/kernels.py\n")
    environ = {
        "CGGUARD_EXEMPT": "capture_disabled=torch._inductor.",
        "CGGUARD_EXEMPT_FILE": str(path),
    }
    expected = [
        "  enabled        (unset)      (CGGUARD_ENABLED)",
        *DEFAULT_CONFIGURATION[:9],
        "  exempt         capture_disabled=torch._inductor. (CGGUARD_EXEMPT)",
        f"  exempt_file    {path!s:<12} (CGGUARD_EXEMPT_FILE)",
        f"  exempt         nested_capture=*/kernels.py ({path})",
        *DEFAULT_CONFIGURATION[11:],
    ]
    assert expected == _configuration(environ)


@pytest.mark.subprocess
def test_runner_refuses_a_bad_entry() -> None:
    """cgguard run --exempt with a malformed entry stops with status 2 and one line."""
    done = subprocess.run(
        [sys.executable, "-m", "cgguard", "run", "--exempt", "capture_disabled=k.py", "true"],
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2,
        "cgguard run: error: argument --exempt: 'capture_disabled=k.py': a file glob holds a "
        f"'/': write */k.py; an entry is {SYNTAX}",
    )


class Counted(tuple[str, str]):
    """A (rule, place) pair that counts the equality comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return tuple.__eq__(self, other)

    __hash__ = tuple.__hash__


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[Counted]:
    """Every entry parsed from now on is a Counted pair; the count starts at zero."""
    real = _exempt_syntax.parse_entry
    monkeypatch.setattr(_exempt_syntax, "parse_entry", lambda entry: Counted(real(entry)))
    monkeypatch.setattr(Counted, "compared", 0)
    return Counted


def many(count: int) -> list[str]:
    """``count`` distinct entries, of the three kinds of place in turn."""
    places = ("pkg{}.mod:Kernel.run", "*/lib{}/kernels.py", "pkg{}.sub.")
    return [f"capture_disabled={places[i % 3].format(i)}" for i in range(count)]


def test_repeated_entries_cost_one_comparison_each(counted: type[Counted]) -> None:
    """parse(): 3,000 entries, each given twice, are de-duplicated with at most one comparison
    per repeat, not one per entry kept before it."""
    entries = many(3000)
    pairs, refused = _exempt_syntax.parse(";".join(entries + entries))
    compared = counted.compared  # before the comparisons of the assertion itself
    assert ([tuple(e.split("=")) for e in entries], []) == (pairs, refused)
    assert compared <= len(entries)


def test_repeated_file_entries_cost_one_comparison_each(
    tmp_path: Path, counted: type[Counted]
) -> None:
    """parse_file(): a file of 3,000 entries a line, each on two lines, is de-duplicated with at
    most one comparison per repeat."""
    entries = many(3000)
    path = tmp_path / "exemptions"
    path.write_text("\n".join(entries + entries) + "\n")
    parsed = _exempt_syntax.parse_file(str(path))
    compared = counted.compared
    assert ([tuple(e.split("=")) for e in entries], [], None) == parsed
    assert compared <= len(entries)


def test_repeated_config_entries_cost_one_comparison_each(counted: type[Counted]) -> None:
    """Config(exempt=...): 3,000 entries, each given twice, are kept once each, with at most one
    comparison per repeat."""
    entries = many(3000)
    config = cgguard.Config(exempt=entries + entries)
    compared = counted.compared
    assert tuple(tuple(e.split("=")) for e in entries) == config.exempt
    assert compared <= len(entries)


def test_a_file_is_parsed_once_until_its_contents_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """parse_file() twice on one file parses its entries once; a file rewritten, even to the same
    size and modification time, is parsed again and gives its new entries."""
    parsed: list[str] = []
    real = _exempt_syntax.parse_entry
    monkeypatch.setattr(
        _exempt_syntax, "parse_entry", lambda entry: parsed.append(entry) or real(entry)
    )
    path = tmp_path / "exemptions"
    path.write_text("capture_disabled=a\nnested_capture=b\n")
    first = _exempt_syntax.parse_file(str(path))
    again = _exempt_syntax.parse_file(str(path))
    seen = os.stat(path)
    path.write_text("capture_disabled=c\nnested_capture=d\n")
    os.utime(path, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    changed = _exempt_syntax.parse_file(str(path))
    assert (first, again, changed, parsed) == (
        ([("capture_disabled", "a"), ("nested_capture", "b")], [], None),
        ([("capture_disabled", "a"), ("nested_capture", "b")], [], None),
        ([("capture_disabled", "c"), ("nested_capture", "d")], [], None),
        ["capture_disabled=a", "nested_capture=b", "capture_disabled=c", "nested_capture=d"],
    )


def catch_all_line(entry: str, rule: str) -> str:
    """The warning for a catch-all exemption, as written independently of the code."""
    return (
        f"the exemption {entry!r} matches every file: it exempts every capture from {rule}; "
        "an exemption meant for one place names its file (*/vllm_plugin/kernels.py), module "
        "or module:qualname"
    )


@pytest.mark.parametrize(
    ("place", "every"),
    [
        ("/*", True),
        ("*/*", True),
        ("**/*", True),
        ("*/**", True),
        ("/?*", True),  # a '?' after the '/': every path has a character there
        ("*/*?", True),
        ("*/", False),  # only a path ending in '/', which no file's does
        ("/", False),
        ("/?", False),  # two characters long only
        ("/??*", False),  # not /a
        ("?/*", False),  # not /a: nothing comes before its '/'
        ("*/*/*", False),  # two folders deep: not /a
        ("*/*.py", False),
        ("/[!x]*", False),  # a class is a character asked for
        ("*/kernels.py", False),
        ("torch", False),  # a module names its own frames only
        ("torch.", False),
        ("torch:Kernel.run", False),
    ],
)
def test_catch_all_is_a_glob_of_every_absolute_path(place: str, every: bool) -> None:
    """A place is a catch-all exactly when it is a file glob matching every absolute path."""
    assert every is _exempt_syntax.is_catch_all(place)


def test_catch_all_in_the_variable_and_the_file_is_a_problem(tmp_path: Path) -> None:
    """read(): an exemption matching every file, in CGGUARD_EXEMPT or in the file, applies and
    is one problem line; the same entry in both is the same line."""
    path = tmp_path / "exemptions"
    path.write_text("sync_during_capture=/*\ncapture_disabled=*/*\n")
    environ = {
        "CGGUARD_EXEMPT": "capture_disabled=*/*;nested_capture=*/kernels.py",
        "CGGUARD_EXEMPT_FILE": str(path),
    }
    expected = (
        {
            "exempt": (("capture_disabled", "*/*"), ("nested_capture", "*/kernels.py")),
            "exempt_file": str(path),
        },
        {"exempt": "CGGUARD_EXEMPT", "exempt_file": "CGGUARD_EXEMPT_FILE"},
        [
            catch_all_line("capture_disabled=*/*", "capture_disabled"),
            catch_all_line("sync_during_capture=/*", "sync_during_capture"),
            catch_all_line("capture_disabled=*/*", "capture_disabled"),
        ],
    )
    assert expected == _settings.read(environ)


def test_catch_all_of_a_config_warns_once_at_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Config(exempt=...) and Config(exempt_file=...) with catch-alls: one line each at install,
    however often installed, and the exemptions apply."""
    path = tmp_path / "exemptions"
    path.write_text("nested_capture=**/*\n")
    config = cgguard.Config(exempt="capture_disabled=/?*", exempt_file=str(path))
    cgguard.install(config)
    cgguard.install(cgguard.Config(exempt="capture_disabled=/?*"))
    cgguard.install(config)
    expected = (
        f"cgguard: {catch_all_line('capture_disabled=/?*', 'capture_disabled')}\n"
        f"cgguard: {catch_all_line('nested_capture=**/*', 'nested_capture')}\n",
        ("capture_disabled=/?*", "nested_capture=**/*"),
    )
    assert expected == (capsys.readouterr().err, cgguard.status().exemptions)


@pytest.mark.subprocess
def test_runner_catch_all_is_one_warning_in_the_program() -> None:
    """cgguard run --exempt with a catch-all runs the program, which says so in one line."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "cgguard", "run", "--exempt", "capture_disabled=*/*"),
            *(sys.executable, "-c", "import torch; print('ran')"),
        ],
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = catch_all_line("capture_disabled=*/*", "capture_disabled")
    assert (0, "ran\n", f"cgguard: {line}\n") == (done.returncode, done.stdout, done.stderr)
