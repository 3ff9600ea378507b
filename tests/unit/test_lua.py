"""The Lua scripts' files: each opens with its contract, helpers are included once, and
what is sent to Redis is the code alone."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from celery_singleton_lock.broker import ride_scripts, transit
from celery_singleton_lock.lease.redis import scripts

from ..support.workers import ROOT

LUA = ROOT / "celery_singleton_lock" / "lease" / "redis" / "lua"
# The scripts that know Celery's or kombu's layout live with the broker ride.
BROKER_LUA = ROOT / "celery_singleton_lock" / "broker" / "lua"
SCRIPTS = sorted([*LUA.glob("*.lua"), *BROKER_LUA.glob("*.lua")])
HELPERS = sorted([*(LUA / "includes").glob("*.lua"), *(BROKER_LUA / "includes").glob("*.lua")])
INCLUDE = re.compile(r'^--- @include "([a-z_]+)"', re.MULTILINE)


def _header(path: Path) -> str:
    lines = path.read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("--") and "@include" not in line)


class TestFiles:
    def test_there_are_scripts_and_helpers(self) -> None:
        assert len(SCRIPTS) >= 15
        assert len(HELPERS) >= 5

    @pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.stem)
    def test_a_script_opens_with_what_it_does_and_its_keys_argv_and_replies(
        self, path: Path
    ) -> None:
        first = path.read_text().splitlines()[0]
        assert first.startswith("-- "), first
        assert len(first) > 20, first
        header = _header(path)
        assert "KEYS[" in header, path.name
        assert "ARGV" in header, path.name
        assert re.search(r"\breturns?\b", header, re.IGNORECASE), path.name

    def test_every_include_names_a_helper_and_every_helper_is_included(self) -> None:
        named = {
            name for path in [*SCRIPTS, *HELPERS] for name in INCLUDE.findall(path.read_text())
        }
        assert named == {path.stem for path in HELPERS}

    def test_the_package_data_ships_every_file(self) -> None:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())
        globs = project["tool"]["setuptools"]["package-data"]["celery_singleton_lock"]
        package = ROOT / "celery_singleton_lock"
        shipped = {path for glob in globs for path in package.glob(glob)}
        assert set(SCRIPTS) | set(HELPERS) <= shipped


class TestSource:
    def test_a_helper_included_twice_is_expanded_once(self) -> None:
        # swap_and_push includes push (which includes note) and hand_on.
        text = ride_scripts.source("swap_and_push")
        assert text.count("local function note(") == 1
        assert text.count("local function push(") == 1
        assert text.count("local function pass_to(") == 1
        assert text.index("local function note(") < text.index("local function push(")

    def test_what_is_sent_has_no_comment_lines(self) -> None:
        for path in SCRIPTS:
            text = scripts.source(path.stem, path.parent)
            assert not [line for line in text.splitlines() if line.lstrip().startswith("--")]
            assert "redis.call" in text or "redis.pcall" in text, path.stem

    def test_the_notes_key_count_is_one_number_in_python_and_lua(self) -> None:
        found = re.search(
            r"local NOTE_KEYS = (\d+)", (BROKER_LUA / "includes" / "note.lua").read_text()
        )
        assert found is not None
        assert int(found.group(1)) == transit.NOTE_KEYS
