"""atheris target ``session_fetch``: see fuzz/fuzzing.py and tidelog.testing.fuzz_targets."""

from fuzzing import fuzz

if __name__ == "__main__":
    fuzz("session_fetch")
