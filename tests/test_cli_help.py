"""`--help` of every subcommand, walked from the real parser (so a subcommand added later is checked too):
a description, capitalised placeholders for every value, defaults shown; and mistyped flags or
subcommands answered with the closest real one."""

from __future__ import annotations

import argparse
import re

import pytest

from qvl_agent import cli

# N, FILE, DIR, URL, HOST:PORT, X,Y,W,H, A,B,..., WxH: capitals, digits and separators (x only between capitals).
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(?:(?:[,:.|-]+|x)[A-Z0-9_]+)*(?:,\.\.\.)?")


def _parsers():
    return list(cli.walk_parsers(cli.build_parser()))


def _shown_default(action: argparse.Action) -> bool:
    return (
        bool(action.option_strings)
        and action.nargs != 0  # on/off flags: their default is the flag's absence
        and action.default not in (None, argparse.SUPPRESS, [])
    )


def test_the_walk_reaches_every_subcommand_including_nested_ones():
    names = {" ".join(path) for path, _ in _parsers()}
    assert {"ask", "serve", "trace list", "trace report", "eval screenspot", "eval miniwob", "doctor"} <= names


@pytest.mark.parametrize("path, parser", _parsers(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_parser_has_a_description_placeholders_in_capitals_and_its_defaults(path, parser):
    if path:
        assert parser.description and parser.description.strip(), f"qvl-agent {' '.join(path)} has no description"
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.nargs == 0:
            continue  # flags (--help, --yes, ...) take no value
        shown = action.metavar
        label = "/".join(action.option_strings) or action.dest
        assert isinstance(shown, str) and PLACEHOLDER.fullmatch(shown), f"{path} {label}: placeholder {shown!r}"
        if _shown_default(action):
            help_text = formatter._expand_help(action)
            assert f"(default: {action.default})" in help_text, f"{path} {label}: {help_text!r}"


def test_every_command_leads_with_its_name_and_what_it_does():
    for path, parser in _parsers():
        if len(path) == 1:
            lead = f"`qvl-agent {path[0]}"
            assert parser.description.startswith(lead), f"qvl-agent {path[0]}: {parser.description!r}"


def test_serve_max_batch_help_gives_the_settings_value(capsys):
    from qvl_agent.config import Settings

    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"default: the max_batch setting, {Settings().max_batch})" in out


def test_help_output_shows_placeholders_and_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--port PORT" in out and "(default: 8000)" in out and "--max-queue N" in out
    assert "(default: 16)" in out and "(16)" not in out.replace("(default: 16)", "")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["brwose"], "unknown command 'brwose': did you mean 'browse'?"),
        (["trace", "lst"], "unknown command 'lst': did you mean 'list'?"),
        (
            ["browse", "--url", "http://example.com", "--heded", "Sign in"],
            "unrecognized argument --heded: did you mean --headed?",
        ),
        (["trace", "list", "--limt", "3"], "unrecognized argument --limt: did you mean --limit?"),
        (["serve", "--max-qeue=4"], "unrecognized argument --max-qeue=4: did you mean --max-queue?"),
        (["tray", "--send", "aks"], "argument --send: invalid choice 'aks': did you mean 'ask'?"),
    ],
)
def test_a_mistyped_subcommand_or_flag_gets_did_you_mean_and_exit_2(capsys, argv, says):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]
    assert message == f"qvl-agent: {says}", err
    assert "Traceback" not in err


def test_an_unknown_flag_with_nothing_close_points_at_the_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["trace", "list", "--zzzzzz"])
    assert done.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message == "qvl-agent: unrecognized argument --zzzzzz (see qvl-agent trace list --help)."


def test_what_the_person_typed_cannot_drive_the_terminal(capsys):
    with pytest.raises(SystemExit):
        cli.main(["trace", "list", "--\x1b[2Jx"])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2Jx" in err
