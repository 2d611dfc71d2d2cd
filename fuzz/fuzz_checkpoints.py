"""atheris target ``checkpoints``: see fuzz/fuzzing.py and tidelog.testing.fuzz_targets."""

from fuzzing import fuzz

if __name__ == "__main__":
    fuzz("checkpoints")
