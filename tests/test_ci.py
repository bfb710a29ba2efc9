"""CI runs what the README tells a new user to run: its one-line test command, verbatim."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [line for line in re.findall(r"```bash\n(.*?)\n```", readme, re.S) if "pytest" in line]
    assert len(commands) == 1, f"the README should give one test command, found {commands}"
    return commands[0]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_test_command() in ci.splitlines()


def test_ci_also_runs_ruff():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "ruff check ." in ci
