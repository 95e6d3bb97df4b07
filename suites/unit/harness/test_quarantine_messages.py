"""harness.quarantine's refusals word for word, its date edges, and the run-time problems.

test_quarantine_file.py checks that each malformed file is refused on the right line; these
check the whole message (what a reviewer reads to fix the file), the exact day boundaries of
``add`` and of an entry's length, and :func:`problems` / :func:`existence_problem`, which the
plugin calls at the start of a run (its tests go through inner pytest runs).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from harness import quarantine as q

TODAY = datetime.date(2026, 11, 30)
ISSUE = "https://github.com/ORG/REPO/issues/123"


def entry_text(test="suites/unit/test_x.py::test_y", **overrides) -> str:
    values = {
        "test": f'"{test}"',
        "reason": '"flaky"',
        "issue": f'"{ISSUE}"',
        "added": "2026-11-30",
        "expires": "2026-12-31",
    }
    values.update(overrides)
    keys = "".join(f"{key} = {value}\n" for key, value in values.items() if value is not None)
    return "[[quarantine]]\n" + keys


def error_of(path: Path) -> q.QuarantineError:
    with pytest.raises(q.QuarantineError) as info:
        q.load(path)
    assert info.value.path == path
    assert str(info.value) == f"{path}:{info.value.line}: {info.value.problem}"
    return info.value


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "quarantine.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- reading -------------------------------------------------------------------------------


def test_a_directory_given_as_the_file_is_refused_saying_so(tmp_path):
    with pytest.raises(q.QuarantineError) as info:
        q.load(tmp_path)
    assert (info.value.path, info.value.line) == (tmp_path, 0)
    assert str(info.value) == (
        f"{tmp_path}: is a directory, not a quarantine file; name the quarantine.toml file itself"
    )


def test_a_path_that_cannot_be_read_gives_the_reason_without_the_errno(tmp_path):
    path = tmp_path / "quarantine.toml" / "below-a-file"
    write(tmp_path, "")
    with pytest.raises(q.QuarantineError) as info:
        q.load(path)
    assert (info.value.path, info.value.line) == (path, 0)
    assert info.value.problem == "cannot read the quarantine file: Not a directory"


def test_a_file_that_is_not_utf8_says_how_to_fix_it(tmp_path):
    path = tmp_path / "quarantine.toml"
    path.write_bytes(b"# caf\xe9\n")
    assert error_of(path).problem == (
        "not UTF-8 (byte 0xe9); TOML files are UTF-8: re-save the file as UTF-8"
    )


# --- parsing -------------------------------------------------------------------------------


def test_a_syntax_error_at_the_end_of_the_file_is_placed_on_its_last_line(tmp_path):
    path = write(tmp_path, entry_text() + 'reason = "unterminated\n')
    error = error_of(path)
    assert error.line == 7
    assert error.problem.startswith("TOML syntax error at column ")
    path = write(tmp_path, "[[quarantine]]\ntest = ")
    error = error_of(path)
    assert error.line == 2 and error.problem.startswith("TOML syntax error")


def test_an_unknown_top_level_key_is_named_with_its_line(tmp_path):
    path = write(tmp_path, "# header\n\nowner = 'me'\n" + entry_text())
    error = error_of(path)
    assert error.line == 3
    assert error.problem == (
        "unknown top-level key 'owner'; the file holds only [[quarantine]] entries: remove it "
        "or move it into an entry"
    )


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('[quarantine]\ntest = "a.py::t"\n', "a single table"),
        ('quarantine = ["a.py::t"]\n', "an inline array"),
    ],
)
def test_a_quarantine_that_is_not_a_list_of_tables_says_what_it_is(tmp_path, text, kind):
    error = error_of(write(tmp_path, "# header\n" + text))
    assert error.line == 2
    assert error.problem == (
        "quarantine must be written as [[quarantine]] tables (double brackets), one per entry, "
        f"not as {kind}; put a [[quarantine]] line above each entry's keys"
    )


def test_an_unknown_key_names_the_entry_and_the_closest_key(tmp_path):
    text = entry_text("a.py::t") + "\n" + entry_text(reasn='"typo"')
    error = error_of(write(tmp_path, text))
    assert error.line == 14  # entry 2 starts on line 8; its sixth key
    assert error.problem == (
        "unknown key 'reasn' in quarantine entry 2; did you mean 'reason'? the keys are test, "
        "reason, issue, added, expires"
    )
    error = error_of(write(tmp_path, entry_text(zzz="1")))
    assert error.problem == (
        "unknown key 'zzz' in quarantine entry 1; the keys are test, reason, issue, added, expires"
    )


def test_missing_keys_name_the_entry_and_every_key(tmp_path):
    text = entry_text("a.py::t") + "\n" + entry_text(reason=None)
    error = error_of(write(tmp_path, text))
    assert error.line == 8
    assert error.problem == (
        "quarantine entry 2 is missing 'reason'; every entry needs test, reason, issue, added, "
        "expires"
    )


@pytest.mark.parametrize(
    ("value", "described"),
    [
        ("true", "a boolean True"),
        ("3", "an integer 3"),
        ("1.5", "a float 1.5"),
        ("[1]", "an inline array [1]"),
        ("{a = 1}", "a single table {'a': 1}"),
        ("12:00:00", "a time datetime.time(12, 0)"),
        ("2026-11-30", "date datetime.date(2026, 11, 30)"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_toml_type(tmp_path, value, described):
    error = error_of(write(tmp_path, entry_text(reason=value)))
    assert error.problem == f'reason must be a string, got {described}; write reason = "..."'


def test_a_date_written_as_an_unparseable_string_gets_an_example_date(tmp_path):
    error = error_of(write(tmp_path, entry_text(expires='"soon"')))
    assert error.problem == (
        "expires must be a TOML date, got the string 'soon'; write expires = 2026-12-31 "
        "without quotes"
    )


def test_an_empty_reason_and_a_bad_issue_say_what_to_write(tmp_path):
    error = error_of(write(tmp_path, entry_text(reason='" "')))
    assert error.problem == (
        "reason is empty; say how the test fails and how often, e.g. 'fails about 1 in 50 on "
        "the GPU runner'"
    )
    error = error_of(write(tmp_path, entry_text(issue='"https://x.org/a b"')))
    assert error.problem.startswith("issue must be the http(s) URL of the issue tracking the fix")


def test_an_entry_may_expire_the_day_it_was_added_or_max_days_later_but_not_outside(tmp_path):
    last = TODAY + datetime.timedelta(days=q.MAX_DAYS)
    for expires in (TODAY, last):
        assert (
            q.load(write(tmp_path, entry_text(expires=expires.isoformat())))[0].expires == expires
        )
    error = error_of(write(tmp_path, entry_text(expires="2026-11-29")))
    assert error.problem == (
        f"expires (2026-11-29) is before added (2026-11-30); set expires to a date from "
        f"2026-11-30 to {last}"
    )
    over = last + datetime.timedelta(days=1)
    error = error_of(write(tmp_path, entry_text(expires=over.isoformat())))
    assert error.problem == (
        f"expires ({over}) is {q.MAX_DAYS + 1} days after added (2026-11-30); a quarantine "
        f"lasts at most {q.MAX_DAYS} days: fix the test, or renew the entry with added = today "
        "and a reason that says why it is still flaky"
    )


# --- add -----------------------------------------------------------------------------------


def _add(path, test="suites/unit/test_x.py::test_y", **kwargs):
    return q.add(path, test, **{"reason": "flaky", "issue": ISSUE, "today": TODAY, **kwargs})


@pytest.mark.parametrize("days", [1, q.MAX_DAYS])
def test_add_accepts_one_day_and_the_maximum(tmp_path, days):
    entry = _add(tmp_path / "quarantine.toml", days=days)
    assert entry.expires == TODAY + datetime.timedelta(days=days)


@pytest.mark.parametrize("days", [0, q.MAX_DAYS + 1])
def test_add_refuses_days_outside_the_range_naming_it(tmp_path, days):
    path = tmp_path / "quarantine.toml"
    with pytest.raises(q.QuarantineError) as info:
        _add(path, days=days)
    assert (info.value.path, info.value.line) == (path, 0)
    assert info.value.problem == (
        f"days must be between 1 and {q.MAX_DAYS}, got {days}; a quarantine is short-term "
        f"(MAX_DAYS = {q.MAX_DAYS}): fix the test instead of parking it longer"
    )
    assert not path.exists()


def test_add_accepts_an_expiry_of_today_and_refuses_yesterday(tmp_path):
    path = tmp_path / "quarantine.toml"
    assert _add(path, expires=TODAY).expires == TODAY
    with pytest.raises(q.QuarantineError) as info:
        _add(path, "suites/unit/test_x.py::test_z", expires=TODAY - datetime.timedelta(days=1))
    assert info.value.line == 0
    assert info.value.problem == (
        f"expires (2026-11-29) is in the past (today is {TODAY}); give a date from today to "
        f"{TODAY + datetime.timedelta(days=q.MAX_DAYS)}"
    )


def test_add_refusals_name_the_line_and_what_to_do(tmp_path):
    path = tmp_path / "quarantine.toml"
    _add(path, "suites/unit/test_x.py::test_y")
    line = q.load(path)[0].line
    with pytest.raises(q.QuarantineError) as info:
        _add(path, "suites/unit/test_x.py::test_y")
    assert info.value.line == line
    assert info.value.problem == (
        "'suites/unit/test_x.py::test_y' is already quarantined (until 2026-12-30); edit that "
        "entry in a reviewed change, or remove it first"
    )
    with pytest.raises(q.QuarantineError) as info:
        _add(path, "suites/unit/test_x.py::test_y[1]")
    assert info.value.problem == (
        "'suites/unit/test_x.py::test_y[1]' is already quarantined by "
        "'suites/unit/test_x.py::test_y', which covers every parametrization; nothing to add"
    )
    with pytest.raises(q.QuarantineError) as info:
        _add(path, "suites/unit/test_x.py::test_y", reason="")
    assert info.value.line == 0 and info.value.problem.startswith("reason is empty")


def test_add_with_a_root_refuses_a_test_that_does_not_exist(tmp_path):
    path = tmp_path / "quarantine.toml"
    with pytest.raises(q.QuarantineError) as info:
        _add(path, "suites/unit/test_gone.py::test_y", root=tmp_path)
    assert info.value.line == 0
    assert info.value.problem == (
        "cannot quarantine 'suites/unit/test_gone.py::test_y': file suites/unit/test_gone.py "
        "does not exist; quarantine a test that exists, by its node id as `pytest "
        "--collect-only -q` prints it from the project root"
    )


# --- problems at run time ------------------------------------------------------------------

SOURCE = """\
class TestGroup:
    def test_in_class(self):
        pass


def test_fn():
    def inner():
        pass
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_m.py").write_text(SOURCE)
    (tmp_path / "suites" / "test_bad.py").write_text("def (:\n")
    return tmp_path


@pytest.mark.parametrize(
    "test",
    [
        "suites/test_m.py::test_fn",
        "suites/test_m.py::test_fn[a[b]]",
        "suites/test_m.py::TestGroup::test_in_class",
        "suites/test_bad.py::test_anything",  # does not parse: collecting it will say so
    ],
)
def test_tests_that_exist_have_no_existence_problem(project, test):
    assert q.existence_problem(project, test) is None


@pytest.mark.parametrize(
    ("test", "problem"),
    [
        ("suites/test_gone.py::t", "file suites/test_gone.py does not exist"),
        (
            "suites/test_m.py",
            "test must be a pytest node id like 'suites/unit/test_x.py::test_y', got "
            "'suites/test_m.py'; give a pytest node id like 'suites/unit/test_x.py::test_y', as "
            "`pytest --collect-only -q` prints it from the project root",
        ),
        ("suites/test_m.py::test_other", "no test test_other in suites/test_m.py"),
        ("suites/test_m.py::test_fn::inner", "no test test_fn::inner in suites/test_m.py"),
        (
            "suites/test_m.py::TestGroup::test_gone",
            "no test TestGroup::test_gone in suites/test_m.py",
        ),
    ],
)
def test_a_missing_test_is_named_with_what_is_missing(project, test, problem):
    assert q.existence_problem(project, test) == problem


def test_a_test_file_outside_the_project_is_a_problem(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    (outside / "test_o.py").write_text("def test_o():\n    pass\n")
    (project / "suites" / "link").symlink_to(outside)
    problem = q.existence_problem(project, "suites/link/test_o.py::test_o")
    assert problem == (
        f"file suites/link/test_o.py resolves to {outside.resolve() / 'test_o.py'}, outside the "
        f"project {project.resolve()}"
    )


def test_problems_name_expired_and_stale_entries_with_their_line_and_fix(project):
    text = (
        entry_text("suites/test_m.py::test_fn", added="2026-09-01", expires="2026-11-29")
        + "\n"
        + entry_text("suites/test_m.py::test_gone")
        + "\n"
        + entry_text("suites/test_m.py::TestGroup::test_in_class")
    )
    path = write(project, text)
    assert q.problems(q.load(path), project, path, TODAY) == [
        f"quarantine.toml:1: quarantine of suites/test_m.py::test_fn expired on 2026-11-29 "
        f"({ISSUE}); fix the test, or extend the entry with a reason",
        "quarantine.toml:8: stale quarantine entry suites/test_m.py::test_gone: no test "
        "test_gone in suites/test_m.py; remove it (harness quarantine remove "
        "'suites/test_m.py::test_gone')",
    ]
    assert q.problems(q.load(path), project, path, datetime.date(2026, 11, 29))[:1] == [
        "quarantine.toml:8: stale quarantine entry suites/test_m.py::test_gone: no test "
        "test_gone in suites/test_m.py; remove it (harness quarantine remove "
        "'suites/test_m.py::test_gone')"
    ]


# --- more exact messages ---------------------------------------------------------------------


def test_a_syntax_error_gives_the_column_or_says_it_is_at_the_end(tmp_path):
    error = error_of(write(tmp_path, '[[quarantine]]\ntest = "a.py::t"\nreason = "unterminated\n'))
    assert (error.line, error.problem) == (
        3,
        "TOML syntax error at column 23: Illegal character '\\n'; fix the syntax (https://toml.io)",
    )
    error = error_of(write(tmp_path, "test = "))
    assert (error.line, error.problem) == (
        1,
        "TOML syntax error at the end of the file: Invalid value; fix the syntax (https://toml.io)",
    )


def test_a_quarantine_written_as_a_string_says_so(tmp_path):
    error = error_of(write(tmp_path, 'quarantine = "x"\n'))
    assert error.problem == (
        "quarantine must be written as [[quarantine]] tables (double brackets), one per entry, "
        "not as a string; put a [[quarantine]] line above each entry's keys"
    )


def test_a_path_with_a_nul_byte_is_a_quarantine_error_not_a_crash(tmp_path):
    path = tmp_path / "quarantine\0.toml"
    with pytest.raises(q.QuarantineError) as info:
        q.load(path)
    assert info.value.problem == "cannot read the quarantine file: embedded null byte"


def test_remove_suggests_every_close_entry(tmp_path):
    path = write(
        tmp_path,
        entry_text("suites/unit/test_a.py::test_one")
        + "\n"
        + entry_text("suites/unit/test_a.py::test_onf"),
    )
    with pytest.raises(q.QuarantineError) as info:
        q.remove(path, "suites/unit/test_a.py::test_onx")
    assert info.value.problem == (
        "no entry for 'suites/unit/test_a.py::test_onx'; did you mean "
        "'suites/unit/test_a.py::test_onf' or 'suites/unit/test_a.py::test_one'?"
    )


def test_a_quarantine_error_survives_pickling_with_its_fields(tmp_path):
    # pytest-xdist and multiprocessing carry exceptions between processes by pickling them.
    import pickle

    error = q.QuarantineError(tmp_path / "quarantine.toml", 3, "bad")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is q.QuarantineError
    assert (copy.path, copy.line, copy.problem, str(copy)) == (
        error.path,
        3,
        "bad",
        str(error),
    )
