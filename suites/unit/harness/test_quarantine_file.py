"""The quarantine file: loading and validating it, editing it, and the `harness quarantine` CLI."""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import quarantine as q
from harness.cli import main

TODAY = datetime.date(2026, 11, 30)
REPO_ROOT = Path(__file__).resolve().parents[3]

VALID = """\
# Flaky tests, reviewed like code.

[[quarantine]]
test = "suites/unit/test_a.py::test_one"
reason = "fails about 1 in 50 on the GPU runner"
issue = "https://github.com/ORG/REPO/issues/1"
added = 2026-11-01
expires = 2026-11-30

# Only the bf16 case flakes.
[[quarantine]]
test = "suites/unit/test_b.py::TestAttention::test_backward[bf16]"
reason = "dq off by 1e-2 on H100 only"
issue = "http://tracker.example.com/browse/ML-7"
added = 2026-11-15
expires = 2026-12-31
"""


def entry_text(test="suites/unit/test_x.py::test_y", **overrides) -> str:
    """One [[quarantine]] table (6 lines, header first); a value of None drops the key."""
    values = {
        "test": f'"{test}"',
        "reason": '"flaky"',
        "issue": '"https://github.com/ORG/REPO/issues/123"',
        "added": "2026-11-30",
        "expires": "2026-12-31",
    }
    values.update(overrides)
    keys = "".join(f"{key} = {value}\n" for key, value in values.items() if value is not None)
    return "[[quarantine]]\n" + keys


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "quarantine.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path) -> q.QuarantineError:
    with pytest.raises(q.QuarantineError) as info:
        q.load(path)
    return info.value


# ---------------------------------------------------------------------------------------------
# load


def test_a_valid_file_loads_into_entries_that_know_their_header_line(tmp_path):
    entries = q.load(write(tmp_path, VALID))

    assert entries == [
        q.Entry(
            test="suites/unit/test_a.py::test_one",
            reason="fails about 1 in 50 on the GPU runner",
            issue="https://github.com/ORG/REPO/issues/1",
            added=datetime.date(2026, 11, 1),
            expires=datetime.date(2026, 11, 30),
            line=3,
        ),
        q.Entry(
            test="suites/unit/test_b.py::TestAttention::test_backward[bf16]",
            reason="dq off by 1e-2 on H100 only",
            issue="http://tracker.example.com/browse/ML-7",
            added=datetime.date(2026, 11, 15),
            expires=datetime.date(2026, 12, 31),
            line=11,
        ),
    ]


def test_a_missing_file_is_an_empty_quarantine(tmp_path):
    assert q.load(tmp_path / "absent.toml") == []


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_or_comment_only_file_is_an_empty_quarantine(tmp_path, text):
    assert q.load(write(tmp_path, text)) == []


def test_the_repos_own_quarantine_file_is_valid_and_explains_the_policy():
    path = REPO_ROOT / "quarantine.toml"
    q.load(path)  # raises on any problem
    header = path.read_text(encoding="utf-8")
    for word in ("reason", "issue", "added", "expires", "still runs", "retried"):
        assert word in header


# (case id, file text, line the error must point at, words the message must contain)
MALFORMED = [
    ("toml-syntax", "# header\n\n[[quarantine]]\ntest = \n", 4, ["TOML syntax error"]),
    ("toml-unterminated", '[[quarantine]]\ntest = "a.py::t', 2, ["TOML syntax error"]),
    ("top-level-key", "# header\nowner = 'me'\n" + entry_text(), 2, ["'owner'", "top-level"]),
    ("top-level-table", entry_text() + "\n[settings]\nx = 1\n", 8, ["'settings'"]),
    ("single-table", "\n[quarantine]\ntest = 'a.py::t'\n", 2, ["[[quarantine]]"]),
    ("inline-array", "quarantine = []\n", 1, ["[[quarantine]]"]),
    ("unknown-key", entry_text(reasn='"x"'), 7, ["'reasn'", "did you mean 'reason'"]),
    ("missing-key", entry_text() + "\n" + entry_text("a.py::t", issue=None), 8, ["'issue'"]),
    ("two-missing-keys", entry_text(issue=None, added=None), 1, ["'issue', 'added'"]),
    ("reason-not-string", entry_text(reason="3"), 3, ["reason must be a string", "integer"]),
    (
        "added-quoted",
        entry_text(added='"2026-11-30"'),
        5,
        ["write added = 2026-11-30 without quotes"],
    ),
    ("expires-quoted", entry_text(expires="'31/12/2026'"), 6, ["without quotes"]),
    ("expires-datetime", entry_text(expires="2026-12-31T10:00:00"), 6, ["date-time"]),
    ("expires-integer", entry_text(expires="30"), 6, ["TOML date", "integer"]),
    ("empty-reason", entry_text(reason='"  "'), 3, ["reason is empty"]),
    ("issue-not-url", entry_text(issue='"ML-123"'), 4, ["http(s) URL", "'ML-123'"]),
    ("issue-ftp", entry_text(issue='"ftp://example.com/1"'), 4, ["http(s) URL"]),
    ("test-no-function", entry_text("suites/unit/test_x.py"), 2, ["node id"]),
    ("test-not-python", entry_text("suites/unit/test_x::test_y"), 2, ["node id"]),
    ("test-absolute", entry_text("/repo/suites/test_x.py::test_y"), 2, ["node id"]),
    ("test-empty", entry_text(""), 2, ["node id"]),
    ("expires-before-added", entry_text(expires="2026-11-29"), 6, ["before added"]),
    ("too-long", entry_text(expires="2027-06-30"), 6, [f"at most {q.MAX_DAYS} days"]),
    ("key-from-a-subtable", entry_text() + "[quarantine.extra]\nx = 1\n", 1, ["'extra'"]),
]


@pytest.mark.parametrize(
    "text, line, words", [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_a_malformed_file_is_an_error_that_names_the_path_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)

    error = load_error(path)

    assert str(error).startswith(f"{path}:{line}: "), str(error)
    assert error.line == line
    for word in words:
        assert word in str(error)


def test_a_duplicate_test_id_is_an_error_that_names_both_lines(tmp_path):
    path = write(tmp_path, entry_text() + "\n" + entry_text("a.py::t") + "\n" + entry_text())

    error = load_error(path)

    assert str(error).startswith(f"{path}:15: ")
    assert "lines 1 and 15" in str(error)


def test_a_file_that_is_not_utf8_is_an_error_on_the_line_of_the_bad_byte(tmp_path):
    path = tmp_path / "quarantine.toml"
    path.write_bytes(entry_text(reason='"caf\xe9"').encode("latin-1"))

    assert str(load_error(path)).startswith(f"{path}:3: not UTF-8")


def test_an_entry_built_in_code_is_validated_too():
    with pytest.raises(ValueError, match="http"):
        q.Entry("a.py::t", "flaky", "ML-1", TODAY, TODAY)


# ---------------------------------------------------------------------------------------------
# matches, find, expiry


def make_entry(test: str, expires: datetime.date = TODAY) -> q.Entry:
    return q.Entry(test, "flaky", "https://example.com/1", expires - datetime.timedelta(1), expires)


def test_an_entry_without_params_covers_every_parametrization():
    entry = make_entry("suites/unit/test_x.py::test_y")

    assert entry.matches("suites/unit/test_x.py::test_y")
    assert entry.matches("suites/unit/test_x.py::test_y[fp16-causal]")
    assert entry.matches("suites/unit/test_x.py::test_y[a[1]]")
    assert not entry.matches("suites/unit/test_x.py::test_y2")
    assert not entry.matches("suites/unit/test_x.py::test_y2[fp16]")
    assert not entry.matches("suites/unit/test_x.py::test")
    assert not entry.matches("other/test_x.py::test_y")


def test_an_entry_with_params_covers_only_that_parametrization():
    entry = make_entry("suites/unit/test_x.py::test_y[fp16]")

    assert entry.matches("suites/unit/test_x.py::test_y[fp16]")
    assert not entry.matches("suites/unit/test_x.py::test_y[bf16]")
    assert not entry.matches("suites/unit/test_x.py::test_y")


def test_find_prefers_the_exact_entry_over_one_covering_all_parametrizations():
    broad = make_entry("a.py::t")
    exact = make_entry("a.py::t[1]")

    assert q.find([broad, exact], "a.py::t[1]") is exact
    assert q.find([broad, exact], "a.py::t[2]") is broad
    assert q.find([broad, exact], "a.py::u") is None


def test_an_entry_holds_through_its_expiry_day_and_expires_the_day_after():
    entry = make_entry("a.py::t", expires=TODAY)

    assert not entry.is_expired(TODAY - datetime.timedelta(days=1))
    assert not entry.is_expired(TODAY)
    assert entry.is_expired(TODAY + datetime.timedelta(days=1))
    assert entry.days_left(TODAY + datetime.timedelta(days=3)) == -3


# ---------------------------------------------------------------------------------------------
# add


def add(path: Path, test: str, **kwargs) -> q.Entry:
    kwargs.setdefault("reason", "flaky")
    kwargs.setdefault("issue", "https://github.com/ORG/REPO/issues/9")
    kwargs.setdefault("today", TODAY)
    return q.add(path, test, **kwargs)


def test_add_dates_the_entry_today_and_expires_it_after_the_default_days(tmp_path):
    path = write(tmp_path, VALID)

    entry = add(path, "suites/unit/test_c.py::test_new")

    assert entry.added == TODAY
    assert entry.expires == TODAY + datetime.timedelta(days=q.DEFAULT_DAYS)
    assert q.find(q.load(path), "suites/unit/test_c.py::test_new") == entry


def test_add_takes_days_or_an_explicit_expiry(tmp_path):
    path = tmp_path / "quarantine.toml"

    assert add(path, "a.py::t", days=7).expires == datetime.date(2026, 12, 7)
    explicit = datetime.date(2027, 1, 5)
    assert add(path, "b.py::t", expires=explicit).expires == explicit


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"days": 0}, "between 1 and"),
        ({"days": q.MAX_DAYS + 1}, "between 1 and"),
        (
            {"expires": TODAY + datetime.timedelta(days=q.MAX_DAYS + 1)},
            f"at most {q.MAX_DAYS} days",
        ),
        ({"expires": TODAY - datetime.timedelta(days=1)}, "in the past"),
    ],
)
def test_add_refuses_a_quarantine_longer_than_the_maximum_or_already_over(tmp_path, kwargs, words):
    path = write(tmp_path, VALID)

    with pytest.raises(q.QuarantineError, match=re.escape(words)):
        add(path, "a.py::t", **kwargs)
    assert path.read_text() == VALID


def test_add_keeps_entries_sorted_by_test_id(tmp_path):
    path = write(tmp_path, VALID)

    add(path, "suites/unit/test_0.py::test_first")
    add(path, "suites/unit/test_z.py::test_last")
    add(path, "suites/unit/test_a.py::test_two")

    tests = [entry.test for entry in q.load(path)]
    assert tests == sorted(tests)
    assert len(tests) == 5


def test_add_returns_the_entrys_line_in_the_rewritten_file(tmp_path):
    path = write(tmp_path, VALID)

    entry = add(path, "suites/unit/test_0.py::test_first")

    assert path.read_text().split("\n")[entry.line - 1] == "[[quarantine]]"
    assert entry.line == q.load(path)[0].line


def test_add_keeps_the_header_comment_and_the_comments_on_entries(tmp_path):
    path = write(tmp_path, VALID)

    add(path, "suites/unit/test_0.py::test_first")
    add(path, "suites/unit/test_az.py::test_between")

    text = path.read_text()
    assert text.startswith("# Flaky tests, reviewed like code.\n\n[[quarantine]]\n")
    # The comment above an entry moves with it when the new entry goes before it.
    assert '# Only the bf16 case flakes.\n[[quarantine]]\ntest = "suites/unit/test_b.py' in text


def test_a_header_comment_right_above_the_first_entry_stays_on_top(tmp_path):
    path = write(tmp_path, "# Header.\n" + entry_text("b.py::t"))

    add(path, "a.py::t")

    assert path.read_text().startswith('# Header.\n\n[[quarantine]]\ntest = "a.py::t"\n')


def test_add_creates_a_missing_file_with_the_explanatory_header(tmp_path):
    path = tmp_path / "quarantine.toml"

    add(path, "a.py::t")

    assert path.read_text().startswith(q.DEFAULT_HEADER)
    assert [entry.test for entry in q.load(path)] == ["a.py::t"]


@pytest.mark.parametrize(
    "test, words",
    [
        ("suites/unit/test_a.py::test_one", "already quarantined (until"),
        ("suites/unit/test_a.py::test_one[3]", "covers every parametrization"),
    ],
)
def test_add_refuses_a_test_that_is_already_quarantined(tmp_path, test, words):
    path = write(tmp_path, VALID)

    with pytest.raises(q.QuarantineError, match=re.escape(words)) as info:
        add(path, test)

    assert str(info.value).startswith(f"{path}:3: ")
    assert path.read_text() == VALID


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"issue": "ML-123"}, "http(s) URL"),
        ({"issue": "github.com/ORG/REPO/issues/1"}, "http(s) URL"),
        ({"reason": ""}, "reason is empty"),
    ],
)
def test_add_refuses_an_entry_without_a_link_or_a_reason(tmp_path, kwargs, words):
    path = write(tmp_path, VALID)

    with pytest.raises(q.QuarantineError) as info:
        add(path, "a.py::t", **kwargs)

    assert words in str(info.value)
    assert path.read_text() == VALID


def test_add_refuses_something_that_is_not_a_node_id(tmp_path):
    with pytest.raises(q.QuarantineError, match="node id"):
        add(tmp_path / "quarantine.toml", "test_y")
    assert not (tmp_path / "quarantine.toml").exists()


def test_add_refuses_to_edit_a_malformed_file(tmp_path):
    text = VALID.replace("added = 2026-11-15", 'added = "2026-11-15"')
    path = write(tmp_path, text)

    with pytest.raises(q.QuarantineError, match=":15: added must be a TOML date"):
        add(path, "a.py::t")
    assert path.read_text() == text


def test_add_escapes_quotes_and_backslashes_so_the_file_stays_valid(tmp_path):
    path = tmp_path / "quarantine.toml"
    reason = 'prints "nan" then \\n; """ends early""" sometimes'

    add(path, 'a.py::t[x"y]', reason=reason)

    assert q.load(path)[0].reason == reason
    assert q.load(path)[0].test == 'a.py::t[x"y]'


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = write(tmp_path, VALID)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        add(path, "a.py::t")

    assert path.read_text() == VALID
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quarantine.toml"]


def test_an_edit_replaces_the_file_in_one_step_and_keeps_its_permissions(tmp_path, monkeypatch):
    path = write(tmp_path, VALID)
    path.chmod(0o644)
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        # What is about to become the file is already complete and valid.
        replaced.append(q.load(Path(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    add(path, "a.py::t")

    assert len(replaced) == 1 and len(replaced[0]) == 3
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quarantine.toml"]


# ---------------------------------------------------------------------------------------------
# remove


def test_remove_deletes_only_that_entry_and_keeps_the_comments(tmp_path):
    path = write(tmp_path, VALID)

    removed = q.remove(path, "suites/unit/test_a.py::test_one")

    assert removed.reason == "fails about 1 in 50 on the GPU runner"
    assert [entry.test for entry in q.load(path)] == [
        "suites/unit/test_b.py::TestAttention::test_backward[bf16]"
    ]
    text = path.read_text()
    assert text.startswith("# Flaky tests, reviewed like code.\n\n# Only the bf16 case flakes.\n")


def test_removing_the_last_entry_leaves_the_header(tmp_path):
    path = tmp_path / "quarantine.toml"
    add(path, "a.py::t")

    q.remove(path, "a.py::t")

    assert path.read_text() == q.DEFAULT_HEADER
    assert q.load(path) == []


def test_remove_of_an_unknown_test_names_the_closest_entries(tmp_path):
    path = write(tmp_path, VALID)

    with pytest.raises(q.QuarantineError) as info:
        q.remove(path, "suites/unit/test_a.py::test_onee")

    assert str(info.value) == (
        f"{path}: no entry for 'suites/unit/test_a.py::test_onee'; "
        "did you mean 'suites/unit/test_a.py::test_one'?"
    )
    assert path.read_text() == VALID


def test_remove_of_one_parametrization_points_at_the_entry_that_covers_it(tmp_path):
    path = write(tmp_path, VALID)

    covering = "quarantined by 'suites/unit/test_a.py::test_one' (line 3)"
    with pytest.raises(q.QuarantineError, match=re.escape(covering)):
        q.remove(path, "suites/unit/test_a.py::test_one[2]")


def test_remove_from_a_missing_file_says_the_file_does_not_exist(tmp_path):
    with pytest.raises(q.QuarantineError, match="does not exist"):
        q.remove(tmp_path / "quarantine.toml", "a.py::t")


def test_remove_refuses_to_edit_a_malformed_file(tmp_path):
    text = VALID + "owner = 'me'\n"
    path = write(tmp_path, text)

    with pytest.raises(q.QuarantineError, match=":17: "):
        q.remove(path, "suites/unit/test_a.py::test_one")
    assert path.read_text() == text


# ---------------------------------------------------------------------------------------------
# The CLI


def cli(*args: str):
    return CliRunner().invoke(main, ["quarantine", *args])


def write_relative_to_today(tmp_path: Path, *expires_in_days: int) -> Path:
    """A file with one entry per offset, added ten days before it expires."""
    today = datetime.date.today()
    blocks = []
    for number, offset in enumerate(expires_in_days):
        expires = today + datetime.timedelta(days=offset)
        added = expires - datetime.timedelta(days=10)
        blocks.append(
            entry_text(
                f"suites/unit/test_{number}.py::test_it",
                added=added.isoformat(),
                expires=expires.isoformat(),
            )
        )
    return write(tmp_path, "\n".join(blocks))


def test_list_shows_each_test_with_its_days_left_and_exits_0(tmp_path):
    path = write_relative_to_today(tmp_path, 5, 0)

    result = cli("list", "--file", str(path))

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["TEST", "DAYS", "LEFT", "EXPIRES", "ADDED", "ISSUE", "REASON"]
    assert lines[1].split()[:2] == ["suites/unit/test_0.py::test_it", "5"]
    assert lines[2].split()[:2] == ["suites/unit/test_1.py::test_it", "0"]
    assert "2 quarantined tests" in result.output and "none expired" in result.output


def test_list_marks_expired_entries_and_exits_1(tmp_path):
    path = write_relative_to_today(tmp_path, 5, -3)

    result = cli("list", "--file", str(path))

    assert result.exit_code == 1, result.output
    assert "suites/unit/test_1.py::test_it  EXPIRED 3d ago" in result.output
    assert "1 expired" in result.output


def test_list_of_an_empty_quarantine_says_so_and_exits_0(tmp_path):
    result = cli("list", "--file", str(tmp_path / "quarantine.toml"))

    assert result.exit_code == 0
    assert "No quarantined tests" in result.output and "does not exist" in result.output


def test_list_of_a_malformed_file_gives_the_line_and_exits_2(tmp_path):
    path = write(tmp_path, entry_text(expires='"2026-12-31"'))

    result = cli("list", "--file", str(path))

    assert result.exit_code == 2
    assert f"{path}:6: expires must be a TOML date" in result.output


def test_list_json_gives_every_field_and_keeps_the_exit_status(tmp_path):
    path = write_relative_to_today(tmp_path, 2, -1)

    result = cli("list", "--file", str(path), "--json")

    assert result.exit_code == 1
    listed = json.loads(result.stdout)
    assert [(item["test"], item["days_left"], item["expired"]) for item in listed] == [
        ("suites/unit/test_0.py::test_it", 2, False),
        ("suites/unit/test_1.py::test_it", -1, True),
    ]
    assert set(listed[0]) == {
        "test",
        "reason",
        "issue",
        "added",
        "expires",
        "days_left",
        "expired",
        "line",
    }


def test_cli_add_then_list_then_remove_uses_quarantine_toml_in_the_current_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    test = "suites/unit/test_x.py::test_y[fp16]"
    (tmp_path / "suites/unit").mkdir(parents=True)
    (tmp_path / "suites/unit/test_x.py").write_text("def test_y():\n    pass\n")

    added = cli(
        "add", test, "--reason", "flaky on GPU", "--issue", "https://x.org/i/1", "--days", "14"
    )
    listed = cli("list")
    removed = cli("remove", test)

    assert added.exit_code == 0, added.output
    assert f"Quarantined {test} until" in added.output and "(14 days)" in added.output
    assert listed.exit_code == 0 and test in listed.output
    assert removed.exit_code == 0, removed.output
    assert f"Removed {test}" in removed.output
    assert q.load(tmp_path / "quarantine.toml") == []


def test_cli_add_with_an_explicit_expiry_date(tmp_path):
    path = tmp_path / "quarantine.toml"
    (tmp_path / "a.py").write_text("def t():\n    pass\n")
    expires = datetime.date.today() + datetime.timedelta(days=20)

    result = cli(
        "add",
        "a.py::t",
        "--reason",
        "r",
        "--issue",
        "https://x.org/1",
        "--expires",
        expires.isoformat(),
        "--file",
        str(path),
    )

    assert result.exit_code == 0, result.output
    assert q.load(path)[0].expires == expires


@pytest.mark.parametrize(
    "args, words",
    [
        (["--issue", "ML-1"], "http(s) URL"),
        (["--issue", "https://x.org/1", "--days", "5", "--expires", "2099-01-01"], "not both"),
        (["--issue", "https://x.org/1", "--days", str(q.MAX_DAYS + 1)], "--days"),
        (["--issue", "https://x.org/1", "--expires", "31/12/2026"], "--expires"),
        (["--issue", "https://x.org/1", "--test-typo"], "No such option"),
    ],
)
def test_cli_add_refuses_bad_arguments_with_exit_2_and_writes_nothing(tmp_path, args, words):
    path = tmp_path / "quarantine.toml"

    result = cli("add", "a.py::t", "--reason", "r", *args, "--file", str(path))

    assert result.exit_code == 2
    assert words in result.output
    assert not path.exists()


def test_cli_add_of_a_duplicate_exits_2_and_names_the_line(tmp_path):
    path = write(tmp_path, VALID)

    result = cli(
        "add",
        "suites/unit/test_a.py::test_one",
        "--reason",
        "r",
        "--issue",
        "https://x.org/1",
        "--file",
        str(path),
    )

    assert result.exit_code == 2
    assert f"{path}:3: " in result.output and "already quarantined" in result.output
    assert path.read_text() == VALID


def test_cli_remove_of_an_unknown_test_exits_2_and_suggests_the_close_one(tmp_path):
    path = write(tmp_path, VALID)

    result = cli("remove", "suites/unit/test_a.py::test_on", "--file", str(path))

    assert result.exit_code == 2
    assert "did you mean 'suites/unit/test_a.py::test_one'?" in result.output


@pytest.mark.parametrize("command", [[], ["list"], ["add"], ["remove"]])
def test_every_quarantine_command_has_help_with_an_example(command):
    result = cli(*command, "--help")

    assert result.exit_code == 0
    assert "harness quarantine" in result.output
    assert "Example" in result.output
